"""The agent exporter's histogram buckets, against their definition."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge

from agent.contract.histograms import LATENCY_SLOTS, latency_bounds
from agent.exporter import BUCKET_NS, cumulative_buckets, serve_metrics


@given(st.dictionaries(st.integers(0, LATENCY_SLOTS - 1), st.integers(1, 10**12), max_size=60))
def test_cumulative_buckets_count_every_slot_below_each_bound(counts: dict[int, int]) -> None:
    """Each bucket holds the I/Os of every slot whose upper edge is at most its bound — the
    one-walk form the exporter uses when it is scraped every second."""
    found = cumulative_buckets(counts)
    expected = [
        sum(c for slot, c in counts.items() if latency_bounds(slot)[1] <= bound)
        for bound in BUCKET_NS
    ]
    assert [count for _, count in found[:-1]] == expected
    assert found[-1] == ("+Inf", sum(counts.values()))
    bounds = [float(label) for label, _ in found[:-1]]
    assert bounds == pytest.approx([b / 1e9 for b in BUCKET_NS], rel=1e-8)


def test_the_metrics_server_answers_plain_and_gzip_alike() -> None:
    """The agent's own /metrics server (gzip at level 1, prometheus_client's application
    inside): the same exposition whether the scraper asks for gzip or not, and 404 elsewhere
    as before."""
    registry = CollectorRegistry(auto_describe=False)
    Gauge("blkpilot_test_value", "A value.", ["device"], registry=registry).labels("loop0").set(2)
    server = serve_metrics("127.0.0.1", 0, registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        plain = httpx.get(url, headers={"Accept-Encoding": "identity"}, timeout=5)
        packed = httpx.get(url, headers={"Accept-Encoding": "gzip"}, timeout=5)
        assert "Content-Encoding" not in plain.headers
        assert packed.headers["Content-Encoding"] == "gzip"
        assert int(packed.headers["Content-Length"]) < len(plain.content)
        assert packed.text == plain.text  # httpx decodes the gzip
        assert 'blkpilot_test_value{device="loop0"} 2.0' in plain.text
        assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    finally:
        server.shutdown()
        server.server_close()
