"""Training data from observations: one sample per benchmark or canary run, with the device's
facts (class, rotational, queues, and what its own observations measured: QD1 read latency,
write/read asymmetry, speed-up from parallel issue), the workload and the configuration.
"""

from __future__ import annotations

import math
import statistics
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from agent.contract.tunables import CompletionMode, DeviceConfig, Scheduler
from agent.contract.workloads import IOPattern, WorkloadSpec
from models.features import DeviceFacts
from models.priors import Objective

# objective -> (metric, higher is better), from Objective.metric (the one definition)
OBJECTIVE_METRIC: dict[Objective, tuple[str, bool]] = {
    o: (o.metric.name, o.metric.higher_is_better) for o in Objective
}


@dataclass(frozen=True)
class Sample:
    device_id: uuid.UUID
    device: dict[str, Any]  # the inventory row as the API shows it
    workload: WorkloadSpec
    config: DeviceConfig
    metrics: dict[str, float]
    finished_at: datetime

    def value(self, objective: Objective) -> float | None:
        metric, _ = OBJECTIVE_METRIC[objective]
        found = self.metrics.get(metric)
        return float(found) if isinstance(found, int | float) else None


def _single_job(workload: WorkloadSpec) -> tuple[IOPattern, int, int] | None:
    if workload.tool != "fio" or len(workload.jobs) != 1 or workload.jobs[0].tasks != 1:
        return None
    job = workload.jobs[0]
    if len(job.block_sizes) != 1:
        return None
    (size,) = job.block_sizes
    return job.pattern, size, job.queue_depth


def _plain(config: DeviceConfig) -> bool:
    return config.scheduler in (None, Scheduler.NONE) and config.completion in (
        None,
        CompletionMode.INTERRUPT,
    )


def measured_facts(samples: Iterable[Sample]) -> dict[uuid.UUID, dict[str, float]]:
    """Per device, from its own plain runs (no scheduler, interrupts): median QD1 4 KiB read
    latency, QD1 write over read latency, and random-read IOPS at SPEEDUP_DEPTH over QD1's."""
    reads: dict[uuid.UUID, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    writes: dict[uuid.UUID, list[float]] = defaultdict(list)
    for sample in samples:
        shape = _single_job(sample.workload)
        if shape is None or not _plain(sample.config):
            continue
        pattern, size, depth = shape
        if size != 4096:
            continue
        if pattern is IOPattern.RANDREAD:
            key = "lat_mean_us" if depth == 1 else "iops"
            if key in sample.metrics:
                reads[sample.device_id][depth].append(float(sample.metrics[key]))
        elif pattern is IOPattern.RANDWRITE and depth == 1 and "lat_mean_us" in sample.metrics:
            writes[sample.device_id].append(float(sample.metrics["lat_mean_us"]))
    facts: dict[uuid.UUID, dict[str, float]] = defaultdict(dict)
    for device_id, by_depth in reads.items():
        if 1 not in by_depth:
            continue
        qd1 = statistics.median(by_depth[1])
        facts[device_id]["qd1_read_us"] = qd1
        if writes.get(device_id):
            facts[device_id]["write_over_read"] = statistics.median(writes[device_id]) / qd1
        speedup = speedup_at(
            {depth: statistics.median(v) / (1e6 / qd1) for depth, v in by_depth.items()}, qd1
        )
        if speedup is not None:
            facts[device_id]["parallel_speedup"] = speedup
    return dict(facts)


SPEEDUP_DEPTH = 16  # parallel_speedup is random-read IOPS at this depth over QD1's


def speedup_at(by_depth: dict[int, float], qd1_us: float) -> float | None:
    """The speed-up from parallel issue at SPEEDUP_DEPTH, the same depth on every device:
    measured there, or interpolated between the measured depths around it on log-log axes
    (from QD1, speed-up 1, where none is shallower) — one device measured at QD16 and another
    at QD32 made the same feature mean two things. None without a depth beyond 1."""
    if qd1_us <= 0:
        return None
    deeper = sorted(d for d in by_depth if d > 1 and by_depth[d] > 0)
    if not deeper:
        return None
    if SPEEDUP_DEPTH in by_depth:
        return float(by_depth[SPEEDUP_DEPTH])
    below = [d for d in deeper if d < SPEEDUP_DEPTH]
    above = [d for d in deeper if d > SPEEDUP_DEPTH]
    low, low_speedup = (below[-1], by_depth[below[-1]]) if below else (1, 1.0)
    high = above[0] if above else below[-1]
    if high == low:  # only shallower depths: the speed-up seen there, not extrapolated
        return float(low_speedup)
    slope = math.log(by_depth[high] / low_speedup) / math.log(high / low)
    return float(low_speedup * (SPEEDUP_DEPTH / low) ** slope)


def sample_from(
    device_id: uuid.UUID,
    device: dict[str, Any],
    workload: dict[str, Any],
    configuration: dict[str, Any],
    metrics: dict[str, Any],
    finished_at: datetime,
) -> Sample | None:
    """One observation as a training sample; None when its workload or configuration no
    longer validates (an allow-list or workload language that moved on)."""
    try:
        spec = WorkloadSpec.model_validate(workload)
        config = DeviceConfig.model_validate(configuration)
    except ValidationError:
        return None
    numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
    return Sample(device_id, device, spec, config, numbers, finished_at)


def facts_for(samples: list[Sample]) -> dict[uuid.UUID, DeviceFacts]:
    measured = measured_facts(samples)
    facts = {}
    for sample in samples:
        if sample.device_id not in facts:
            facts[sample.device_id] = DeviceFacts.from_inventory(
                sample.device, measured.get(sample.device_id, {})
            )
    return facts
