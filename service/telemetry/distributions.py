"""A batch's eBPF distributions checked and summarised in a few numpy calls, not slot by slot.

The contract checks each operation of a window on its own (`OperationLatency._consistent`:
every histogram's slots increasing and in range, device time and sizes adding up to the
count, the percentiles non-decreasing and the device-time histogram's own) and summarises a
window by its merged read and write histogram (`window_percentiles_us`). In Python, one slot
at a time, that is where an eBPF window's cost went: with the histograms our collector
really sends (24-76 slots, from pgbench and db_bench; bench.ingest --ebpf) the checks and the
summary cost `serve` 6-9 times what decoding a whole diskstats window does.

Here the same tests run on every histogram of the batch at once: the histograms laid end to
end in arrays, their running counts one cumulative sum, and each percentile's slot found by
one `searchsorted` — exactly the contract's slot, because a running count (an integer)
reaches a rank `q * total` exactly when it reaches `ceil(q * total)`, so the search runs on
integers where sums of floats could round. The interpolation inside the slot is the
contract's expression, operation for operation, so the percentiles are the same floats.

The contract stays the definition: `consistent` may only say "not sure" (False) where the
contract would take the batch — the decoder then leaves the batch to the pydantic model,
which judges it and says why — never True where it would refuse
(tests/service/test_distributions.py holds the two side by side).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import chain, compress, repeat
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from agent.contract import histograms
from agent.contract.base import MAX_IOS_PER_WINDOW
from agent.contract.wire import IoOperation

_LOW, _HIGH = (
    np.array([histograms.latency_bounds(slot)[i] for slot in range(histograms.LATENCY_SLOTS)])
    for i in (0, 1)
)
_QUANTILES = np.array(list(histograms.PERCENTILES.values()))  # p50, p95, p99, p999
_SUMMARY = [list(histograms.PERCENTILES).index(name) for name in ("p50", "p99", "p999")]
_MERGED = (IoOperation.READ, IoOperation.WRITE)  # what a window's summary merges
_NONE = {"p50_us": None, "p99_us": None, "p999_us": None}
_LIMITS = (histograms.LATENCY_SLOTS, histograms.SIZE_SLOTS, histograms.LATENCY_SLOTS)
# an operation's and a window's fields, read in C over a whole batch (map), not in a loop
_OPERATIONS = attrgetter("operations")
_OP, _COUNT = attrgetter("op"), attrgetter("count")
_DEVICE_NS, _SIZE_BYTES = attrgetter("device_ns"), attrgetter("size_bytes")
_QUEUE_NS = attrgetter("queue_ns")
_GIVEN = attrgetter("p50_us", "p95_us", "p99_us", "p999_us")

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

_DIGITS = b"0123456789"


@lru_cache(maxsize=512)
def _punctuation(pairs: int) -> bytes:
    """A histogram of `pairs` pairs written compact, its digits left out: [[,],[,]]."""
    return b"[]" if pairs <= 0 else b"[" + b"[,]," * (pairs - 1) + b"[,]]"


class _EndToEnd:
    """Sparse histograms laid end to end: every slot and count, and where each one starts."""

    def __init__(self, slots: Ints, counts: Ints, lengths: Ints) -> None:
        self.slots = slots
        self.counts = counts
        self.lengths = lengths
        self.ends: Ints = np.cumsum(lengths)
        self.starts: Ints = self.ends - lengths
        # running[i]: the counts before slot i, over all histograms (running[0] = 0)
        self.running: Ints = np.concatenate(([0], np.cumsum(counts)))
        self.totals: Ints = self.running[self.ends] - self.running[self.starts]

    def head(self, n: int) -> _EndToEnd:
        """The first n histograms."""
        pairs = int(self.ends[n - 1]) if n else 0
        return _EndToEnd(self.slots[:pairs], self.counts[:pairs], self.lengths[:n])

    @classmethod
    def parse(cls, sent: Sequence[bytes | msgspec.Raw], taken: bool = False) -> _EndToEnd | None:
        """Histograms as they were sent (JSON the decoder found well-formed, msgspec.Raw), or
        None unless each is written compact as an array of [integer, integer] pairs of
        digits alone — what the agent sends (anything else, spaces included, the model
        judges). Past int64 a number is read as int64's largest, which no check takes.
        `taken`: histograms `check` took, whose form is not checked again.

        The histograms are read together, joined by "|" (which no JSON outside a string holds),
        in a few passes over the bytes: no histogram is looked at on its own in Python."""
        if not sent:
            return cls(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
        joined = b"|".join(sent)
        # valid JSON whose characters but its digits are those of compact arrays of
        # [integer, integer] pairs is such arrays (anything else, a space, a sign, a point,
        # an exponent, a quote, is left in the punctuation and differs from the expected)
        punctuation = joined.translate(None, _DIGITS)
        each = punctuation.split(b"|")
        if len(each) != len(sent):
            return None
        if taken:  # valid JSON, maybe not compact: each opened pair is one more "["
            pairs = [opened - 1 for opened in map(bytes.count, each, repeat(b"[", len(each)))]
            lengths = np.array(pairs, dtype=np.int64)
        else:
            # n pairs written compact leave 4n + 1 characters of punctuation ("[]" for none:
            # 2), so its length says how many pairs a histogram holds if it is written so at
            # all — which the comparison with what n pairs must leave then checks
            lengths = (np.fromiter(map(len, each), dtype=np.int64, count=len(each)) - 1) >> 2
            pairs = lengths.tolist()
            if b"|".join(map(_punctuation, pairs)) != punctuation:
                return None
        # the numbers of the histograms that have any, comma-separated, in one parse
        joined = b",".join(compress(sent, pairs)).translate(None, b"[]")
        values = (
            np.fromstring(joined, dtype=np.int64, sep=",")  # text mode: not deprecated
            if joined
            else np.zeros(0, dtype=np.int64)
        )
        if values.size != 2 * int(lengths.sum()):
            return None
        return cls(values[0::2], values[1::2], lengths)

    def well_formed(self, limits: Ints) -> bool:
        """Every histogram's slots strictly increasing within [0, its limit), counts within
        (0, MAX_IOS_PER_WINDOW] (the contract's Histogram)."""
        if not self.slots.size:
            return True
        first = np.zeros(self.slots.size, dtype=bool)
        first[self.starts[self.lengths > 0]] = True
        rising = np.diff(self.slots) > 0
        return bool(
            (self.counts > 0).all()
            and (self.counts <= MAX_IOS_PER_WINDOW).all()
            and (self.slots >= 0).all()
            and (self.slots < np.repeat(limits, self.lengths)).all()
            and (rising | first[1:]).all()
        )

    def percentiles_us(self) -> Floats:
        """(histogram, percentile) in µs of latency histograms, each what
        histograms.percentiles_us gives; 0 for an empty histogram (which has none)."""
        totals = self.totals.astype(np.float64)
        ranks = _QUANTILES[None, :] * totals[:, None]
        empty = (self.totals == 0)[:, None]
        if not self.slots.size:
            return np.zeros(ranks.shape)
        before = self.running[self.starts][:, None]
        # the first slot whose running count within its histogram reaches the rank
        at = np.searchsorted(self.running[1:], before + np.ceil(ranks).astype(np.int64))
        at = np.where(empty, 0, np.minimum(at, self.ends[:, None] - 1))
        slots = self.slots[at]
        share = self.counts[at].astype(np.float64)
        seen = (self.running[at] - before).astype(np.float64)
        low, high = _LOW[slots], _HIGH[slots]
        found = (low + (high - low) * np.maximum(0.0, ranks - seen) / share) / 1000
        return np.where(empty, 0.0, found)


def check(batch: Any) -> _EndToEnd | None:
    """Every operation's device-time histogram, in the batch's order, if every operation of
    every window passes OperationLatency's checks; None if any might not (the model then
    judges the batch). What it returns is what window_summaries reads."""
    operations = list(chain.from_iterable(map(_OPERATIONS, batch.windows)))
    n = len(operations)
    laid = _EndToEnd.parse(
        list(map(_DEVICE_NS, operations))
        + list(map(_SIZE_BYTES, operations))
        + list(map(_QUEUE_NS, operations))
    )
    if laid is None:
        return None
    limits = np.repeat(np.array(_LIMITS, dtype=np.int64), n)
    if not laid.well_formed(limits):
        return None
    counts = np.fromiter(map(_COUNT, operations), dtype=np.int64, count=n)
    if not ((laid.totals[:n] == counts) & (laid.totals[n : 2 * n] == counts)).all():
        return None
    device_ns = laid.head(n)
    if not n:
        return device_ns
    given = np.fromiter(
        chain.from_iterable(map(_GIVEN, operations)), dtype=np.float64, count=4 * n
    ).reshape(n, 4)
    if not (np.diff(given, axis=1) >= 0).all():
        return None
    computed = device_ns.percentiles_us()
    if not (np.abs(computed - given) <= 1e-6 * np.maximum(1.0, given)).all():
        return None
    return device_ns


def consistent(batch: Any) -> bool:
    """True if every operation of every window passes OperationLatency's checks; False if
    any might not."""
    return check(batch) is not None


def window_summaries(
    windows: Sequence[Any], device_ns: _EndToEnd | None = None
) -> list[dict[str, float | None]]:
    """window_percentiles_us of each window — p50, p99 and p99.9 of its reads' and writes'
    device time merged; None where it has neither (or no eBPF). Of windows the contract
    took: `device_ns`, what `check` returned of them, or read here again."""
    return [
        dict(_NONE) if found is None else dict(zip(_NONE, found, strict=True))
        for found in window_percentiles(windows, device_ns)
    ]


def window_percentiles(
    windows: Sequence[Any], device_ns: _EndToEnd | None = None
) -> list[tuple[float, float, float] | None]:
    """window_summaries' percentiles as (p50, p99, p99.9) in µs, or None for a window with
    neither reads nor writes in its distributions (or none): what the storing statement
    reads, without a dict a window — a batch of diskstats windows is a list of Nones."""
    per_window = list(map(len, map(_OPERATIONS, windows)))
    operations = list(chain.from_iterable(map(_OPERATIONS, windows)))
    laid = device_ns
    if laid is None:  # a batch the model took: its histograms read here
        laid = _EndToEnd.parse(list(map(_DEVICE_NS, operations)), taken=True)
    if laid is None or laid.lengths.size != len(operations):
        raise ValueError("window_summaries takes the device-time histograms `check` took")
    if not laid.slots.size:
        return [None] * len(windows)
    owner = np.repeat(np.arange(len(windows), dtype=np.int64), per_window)
    merged_op = np.fromiter(
        (op in _MERGED for op in map(_OP, operations)), dtype=bool, count=len(operations)
    )
    # each window's read and write histograms merged: counts summed per (window, slot) in one
    # dense array (as floats: exact, for counts of at most MAX_IOS_PER_WINDOW, 3.6e11, far
    # below 2**53), then its non-empty slots in order, laid end to end again
    keys = np.repeat(owner, laid.lengths) * histograms.LATENCY_SLOTS
    keys += laid.slots
    weights = np.where(np.repeat(merged_op, laid.lengths), laid.counts, 0)
    dense = np.bincount(
        keys, weights=weights, minlength=len(windows) * histograms.LATENCY_SLOTS
    ).astype(np.int64)
    held = np.flatnonzero(dense)
    merged = _EndToEnd(
        held % histograms.LATENCY_SLOTS,
        dense[held],
        np.bincount(held // histograms.LATENCY_SLOTS, minlength=len(windows)),
    )
    values = merged.percentiles_us()[:, _SUMMARY].tolist()
    return [
        (found[0], found[1], found[2]) if held else None
        for found, held in zip(values, merged.lengths.tolist(), strict=True)
    ]
