"""The agent exporter's histogram buckets, against their definition."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.metrics_core import Metric

from agent.contract.histograms import LATENCY_SLOTS, latency_bounds
from agent.exporter import (
    BUCKET_NS,
    METRICS_WORKERS,
    REQUEST_TIMEOUT_S,
    LatencyHistogram,
    cumulative_buckets,
    exposition,
    serve_metrics,
)


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
    server = serve_metrics("127.0.0.1", 0, registry.collect)
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


def test_scrapes_are_answered_beside_clients_that_say_nothing() -> None:
    """The server's few long-lived workers: connections that send nothing hold at most one
    worker each (for REQUEST_TIMEOUT_S), scrapes at once beside them are all answered, and the
    workers end with the server."""
    registry = CollectorRegistry(auto_describe=False)
    Gauge("blkpilot_test_value", "A value.", registry=registry).set(1)
    server = serve_metrics("127.0.0.1", 0, registry.collect)
    silent = [
        socket.create_connection(("127.0.0.1", server.server_port))
        for _ in range(METRICS_WORKERS - 1)
    ]
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: httpx.get(url, timeout=30), range(16)))
        assert [a.status_code for a in answers] == [200] * 16
        assert all("blkpilot_test_value 1.0" in a.text for a in answers)
    finally:
        for connection in silent:
            connection.close()
        server.shutdown()
        server.server_close()
    workers = [t for t in threading.enumerate() if t.name.startswith("metrics-")]
    for worker in workers:
        worker.join(timeout=REQUEST_TIMEOUT_S + 5)
    assert not any(w.is_alive() for w in workers)


LABEL_VALUES = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ['a"b', "a\\b", "a\nb", "\\n", "loop0", ""]
)
VALUES = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**15), 10**15)


@given(st.lists(st.tuples(LABEL_VALUES, VALUES), min_size=1, max_size=8, unique_by=lambda t: t[0]))
def test_the_exposition_is_prometheus_clients_byte_for_byte(
    samples: list[tuple[str, float]],
) -> None:
    """The agent writes the text format itself (a third of prometheus_client's time): the
    same bytes for any label value (quotes, backslashes, newlines, any UTF-8) and any value
    (infinities, NaN, Go's earlier switch to exponents), for every kind of family it exports —
    and for a Counter's `_created` sample, written as a gauge of its own."""
    registry = CollectorRegistry(auto_describe=False)
    gauge = Gauge(
        "blkpilot_test_gauge", 'Help with a \\ and\na "line".', ["device"], registry=registry
    )
    counter = Counter("blkpilot_test", "A counter.", ["device"], registry=registry)
    histogram = Histogram("blkpilot_test_seconds", "A histogram.", ["device"], registry=registry)
    info = Info("blkpilot_test_build", "An info.", registry=registry)
    info.info({"version": samples[0][0]})
    for label, value in samples:
        gauge.labels(label).set(value)
        if value == value and value >= 0:
            counter.labels(label).inc(value)
            histogram.labels(label).observe(value)
    assert exposition(registry.collect()) == generate_latest(registry)


@given(
    st.lists(
        st.tuples(
            st.tuples(LABEL_VALUES, LABEL_VALUES, st.sampled_from(["read", "write", 'o"p\\'])),
            st.dictionaries(st.integers(0, LATENCY_SLOTS - 1), st.integers(1, 10**15), max_size=40),
            st.floats(min_value=0, max_value=1e9) | st.integers(0, 10**12),
        ),
        max_size=6,
        unique_by=lambda series: series[0],
    )
)
def test_latency_histograms_written_directly_are_prometheus_clients_text(
    series: list[tuple[tuple[str, str, str], dict[int, int], float]],
) -> None:
    """The scrape writes the latency histograms straight from their buckets: the same bytes
    as prometheus_client writes for the same family (any label value, counts past Go's switch
    to exponents, any sum)."""
    direct = LatencyHistogram("blkpilot_test_latency_seconds", "Time per I/O.\nA \\ in it.")
    for labels, counts, total in series:
        direct.series.append((labels, cumulative_buckets(counts), total))
    registry = CollectorRegistry(auto_describe=False)

    class Family:
        def collect(self) -> list[Metric]:
            return [direct.family()]

    registry.register(Family())
    assert exposition([direct]) == generate_latest(registry)
