"""A device-hour's eBPF histograms merged from its raw windows, for the hourly roll-up.

The roll-up did this in SQL: every (slot, count) pair of every window exploded into a row by
`jsonb_array_elements` and grouped by device, hour, operation, kind and slot. With the
histograms our collector really sends (24-76 slots, bench.ingest --ebpf) that cost
PostgreSQL more than storing the window had — 100-120 µs a window against 85-95 to ingest it,
and 1.5 for a diskstats window's sums (bench/results/ingest.md, 2026-11-28). Here a window's
operations are read as they were stored (msgspec, typed: a pair that is not two integers
refuses the hour, as the SQL casts did) and summed slot by slot in dicts, device-hour by
device-hour as the rows come: memory holds one device-hour's windows at a time (and the
merged histograms of the thousand device-hours written back in one statement).

What is written is what the SQL wrote: per operation, in order of its name, `count` (the
device-time histogram's total; null without one) and the merged `device_ns`, `queue_ns` and
`size_bytes` histograms (pairs in slot order, `[]` where none); an operation none of whose
histograms has a pair is left out. tests/service/test_hourly.py holds the two side by side.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

Pairs = list[tuple[int, int]]


class StoredOperation(msgspec.Struct, frozen=True):
    """An operation of a raw window as ingest stored it (OperationLatency's fields); the
    percentiles and count are the window's and are not merged."""

    op: str
    device_ns: Pairs = []
    queue_ns: Pairs = []
    size_bytes: Pairs = []


_DECODER = msgspec.json.Decoder(list[StoredOperation])
KINDS = ("device_ns", "queue_ns", "size_bytes")  # OperationLatency's histograms (a test holds it)


class UnreadableHistograms(ValueError):
    """A stored window's operations are not what ingest stores: the hour cannot be rolled up."""


def merge_hour(stored: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The hour's operations from its windows' stored `operations` JSON. Summed here, not by
    gathering each kind's histograms for `agent.contract.histograms.merge`: that made the
    upkeep's roll-up 2.4 times dearer (12.4-13.1 → 30.0-30.5 µs a window, bench.ingest --ebpf
    alternated twice, 2026-11-28); the sums and their order are the same (test_hourly)."""
    totals: dict[str, tuple[dict[int, int], dict[int, int], dict[int, int]]] = {}
    for text in stored:
        try:
            operations = _DECODER.decode(text)
        except msgspec.DecodeError as error:
            raise UnreadableHistograms(f"a window's histograms do not parse: {error}") from error
        for operation in operations:
            kinds = totals.get(operation.op)
            if kinds is None:
                kinds = totals[operation.op] = ({}, {}, {})
            for total, pairs in zip(
                kinds, (operation.device_ns, operation.queue_ns, operation.size_bytes), strict=True
            ):
                get = total.get
                for slot, count in pairs:
                    total[slot] = get(slot, 0) + count
    merged: list[dict[str, Any]] = []
    for op in sorted(totals):
        device_ns, queue_ns, size_bytes = totals[op]
        if not (device_ns or queue_ns or size_bytes):
            continue
        merged.append(
            {
                "op": op,
                "count": sum(device_ns.values()) if device_ns else None,
                "device_ns": sorted(device_ns.items()),
                "queue_ns": sorted(queue_ns.items()),
                "size_bytes": sorted(size_bytes.items()),
            }
        )
    return merged
