"""Workload mapping: what a device really does, as the nearest benchmarked workload.

A device's recent telemetry windows (read share, mean request size, average requests in
flight) are summarised — busy windows only, weighted by their I/O count — and compared with
each benchmarked workload's shape on three axes: read share, log2 of the request size and
log2 of the requests in flight (queue depth times tasks for closed-loop jobs, thinned by
thinktime). Recommendations then follow the nearest workload, with the distance saying how
well it fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.contract import histograms
from agent.contract.workloads import WorkloadSpec
from models.features import workload_features

MIN_IOPS = 1.0  # windows below this are idle and say nothing of the workload


@dataclass(frozen=True)
class Shape:
    read_share: float
    request_kib: float
    in_flight: float

    def axes(self) -> tuple[float, float, float]:
        return (
            self.read_share,
            math.log2(max(self.request_kib, 0.5)),
            math.log2(max(self.in_flight, 0.25)),
        )


@dataclass(frozen=True)
class Match:
    workload: WorkloadSpec
    distance: float
    observed: Shape


def _from_distributions(window: Mapping[str, Any]) -> tuple[float, float] | None:
    """(median request KiB, requests in flight) from a window's eBPF distributions: the median
    size, not the mean (4 KiB reads beside a few 1 MiB writes are a 4 KiB workload, not a
    300 KiB one), and Little's law on the device time (IOPS x mean time per request)."""
    operations = [o for o in window.get("operations") or [] if o.get("op") in ("read", "write")]
    if not operations:
        return None
    sizes = histograms.merge([tuple(pair) for pair in o["size_bytes"]] for o in operations)
    median = histograms.quantile(sizes, 0.5, bounds="size")
    count = sum(c for _, c in sizes)
    busy_ns = 0.0
    for operation in operations:
        for slot, n in operation["device_ns"]:
            low, high = histograms.latency_bounds(slot)
            busy_ns += n * (low + high) / 2
    if median is None or count == 0:
        return None
    # a size slot holds [2^k, 2^(k+1)): requests are whole powers of two, its lower edge
    size_kib = histograms.size_bounds(_size_slot(median))[0] / 1024
    return size_kib, float(window.get("iops", 0.0)) * busy_ns / count / 1e9


def _size_slot(size: float) -> int:
    return max(0, int(size).bit_length() - 1)


def observed_shape(windows: Iterable[Mapping[str, Any]]) -> Shape | None:
    """The I/O-weighted shape of the busy windows; None when the device was idle. Windows with
    eBPF distributions give the median request size and the in-flight count from per-I/O
    times; others, diskstats' means."""
    total = share = size = depth = 0.0
    for window in windows:
        iops = float(window.get("iops", 0.0))
        if iops < MIN_IOPS:
            continue
        weight = float(window.get("read_ios", 0)) + float(window.get("write_ios", 0)) or iops
        total += weight
        share += weight * float(window["read_share"])
        measured = _from_distributions(window)
        if measured is not None:
            size += weight * measured[0]
            depth += weight * measured[1]
        else:
            size += weight * float(window["mean_request_bytes"]) / 1024
            depth += weight * float(window["queue_depth"])
    if total == 0:
        return None
    return Shape(share / total, size / total, depth / total)


def workload_shape(workload: WorkloadSpec) -> Shape:
    features = workload_features(workload)
    # a closed-loop task keeps its queue full except while it thinks; with thinktime about
    # its service time, about half of it
    thinking = 0.5 if features["thinktime_us"] > 0 else 1.0
    in_flight = features["queue_depth"] * features["tasks"] * thinking
    return Shape(features["read_share"], features["request_kib"], in_flight)


def nearest(
    windows: Iterable[Mapping[str, Any]], workloads: Iterable[WorkloadSpec], k: int = 1
) -> list[Match]:
    """The k benchmarked workloads closest to what the windows show, closest first."""
    observed = observed_shape(windows)
    if observed is None:
        return []
    here = observed.axes()
    # read share spans 0-1, the log axes ~10 octaves: reads against writes weigh as much as
    # a 32x difference in request size, since it changes what a scheduler does far more
    weights = (25.0, 1.0, 1.0)
    matches = []
    for workload in workloads:
        there = workload_shape(workload).axes()
        squares = (w * (a - b) ** 2 for w, a, b in zip(weights, here, there, strict=True))
        distance = math.sqrt(sum(squares))
        matches.append(Match(workload, distance, observed))
    return sorted(matches, key=lambda m: (m.distance, m.workload.name))[:k]
