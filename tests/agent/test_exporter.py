"""The agent exporter's histogram buckets, against their definition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.contract.histograms import LATENCY_SLOTS, latency_bounds
from agent.exporter import BUCKET_NS, cumulative_buckets


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
