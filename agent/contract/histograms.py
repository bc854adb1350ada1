"""Latency and request-size distributions as the agent measures them (eBPF, agent/ebpf/) and
everyone else reads them: sparse histograms of slot -> count, with the slot schemes fixed here.

- Latency, in nanoseconds: slots 0-7 hold 0-7 ns exactly; above, every power of two is split
  into 8 linear sub-buckets (a bucket is at most 12.5 % wide), like HdrHistogram with 3
  significant bits. bcc's biolatency uses plain powers of two — too coarse to compare a p99
  between canary intervals.
- Size, in bytes: plain powers of two (slot k holds [2^k, 2^(k+1)); 4 KiB requests are slot 12).

Percentiles interpolate linearly inside the bucket that holds the rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

LATENCY_SLOTS = 320
SIZE_SLOTS = 64
SUB_BUCKETS = 8
PERCENTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "p999": 0.999}

Sparse = list[tuple[int, int]]  # (slot, count), slots strictly increasing, counts > 0


def latency_bounds(slot: int) -> tuple[float, float]:
    """[low, high) in ns of a latency slot."""
    if slot < SUB_BUCKETS:
        return float(slot), float(slot + 1)
    power = slot // SUB_BUCKETS + 2
    sub = slot % SUB_BUCKETS
    width = 1 << (power - 3)
    low = (SUB_BUCKETS + sub) << (power - 3)
    return float(low), float(low + width)


def latency_slot(ns: float) -> int:
    """The slot a value falls in (the BPF program's computation, for tests and tools)."""
    value = int(ns)
    if value < SUB_BUCKETS:
        return max(value, 0)
    power = value.bit_length() - 1
    slot = (power - 2) * SUB_BUCKETS + ((value >> (power - 3)) & 7)
    return min(slot, LATENCY_SLOTS - 1)


def size_bounds(slot: int) -> tuple[float, float]:
    return float(1 << slot), float(1 << (slot + 1))


def sparse(counts: Iterable[int]) -> Sparse:
    return [(slot, int(count)) for slot, count in enumerate(counts) if count]


def merge(histograms: Iterable[Mapping[int, int] | Sparse]) -> Sparse:
    total: dict[int, int] = {}
    for histogram in histograms:
        items = histogram.items() if isinstance(histogram, Mapping) else histogram
        for slot, count in items:
            total[slot] = total.get(slot, 0) + count
    return sorted((s, c) for s, c in total.items() if c)


def check(histogram: Sparse, slots: int) -> int:
    """The histogram's count; ValueError if its slots are not strictly increasing and in range
    or a count is not positive."""
    previous = -1
    total = 0
    for slot, count in histogram:
        if not previous < slot < slots:
            raise ValueError(
                f"histogram slots must increase strictly within [0, {slots}): {slot} after"
                f" {previous}"
            )
        if count <= 0:
            raise ValueError(f"histogram slot {slot} has a count of {count}")
        previous = slot
        total += count
    return total


def quantile(histogram: Sparse, q: float, bounds: str = "latency") -> float | None:
    """The q-quantile (0 < q <= 1) in the slot scheme's unit; None for an empty histogram."""
    edges = latency_bounds if bounds == "latency" else size_bounds
    return _quantile([(slot, float(count)) for slot, count in histogram], q, edges)


def _quantile(
    mass: list[tuple[int, float]], q: float, edges: Callable[[int], tuple[float, float]]
) -> float | None:
    """Walk slots in order to the one holding rank q, interpolating linearly inside it."""
    total = sum(share for _, share in mass)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for slot, share in mass:
        if seen + share >= rank:
            low, high = edges(slot)
            return low + (high - low) * max(0.0, rank - seen) / share
        seen += share
    return edges(mass[-1][0])[1]


_ASCENDING = sorted(PERCENTILES.items(), key=lambda item: item[1])


def percentiles_us(histogram: Sparse) -> dict[str, float]:
    """p50, p95, p99 and p99.9 in microseconds of a latency histogram (ns slots): each what
    `quantile` gives, in one walk of the slots (every window is checked with it twice — where
    the agent makes it and where it is validated)."""
    total = float(sum(count for _, count in histogram))
    if total <= 0:
        return {}
    wanted = iter(_ASCENDING)
    name, q = next(wanted)
    rank = q * total
    found: dict[str, float] = {}
    seen = 0.0
    for slot, count in histogram:
        share = float(count)
        if seen + share < rank:
            seen += share
            continue
        low, high = latency_bounds(slot)
        while seen + share >= rank:
            found[name] = (low + (high - low) * max(0.0, rank - seen) / share) / 1000
            if (following := next(wanted, None)) is None:
                return {n: found[n] for n in PERCENTILES}
            name, q = following
            rank = q * total
        seen += share
    top = latency_bounds(histogram[-1][0])[1] / 1000  # a rank past the sum by rounding
    for rest, _ in [(name, q), *wanted]:
        found[rest] = top
    return {n: found[n] for n in PERCENTILES}


def weighted_quantile(strata: Mapping[object, tuple[float, Sparse]], q: float) -> float | None:
    """The q-quantile of a mixture: each stratum's latency histogram weighted by a share (the
    shares need not add up to 1). Used to compare intervals under one traffic mix."""
    mass: dict[int, float] = {}
    for weight, histogram in strata.values():
        total = sum(count for _, count in histogram)
        if weight <= 0 or total == 0:
            continue
        for slot, count in histogram:
            mass[slot] = mass.get(slot, 0.0) + weight * count / total
    return _quantile(sorted(mass.items()), q, latency_bounds)
