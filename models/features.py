"""Features of a device, a workload and a configuration, as flat dicts of numbers.

The same functions serve training rows (observations) and queries (a device's candidates), so
a model never sees a feature computed two ways. Categorical values are one-hot encoded here,
with a fixed vocabulary from agent.contract.wire, so that rows built at different times line up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.contract.tunables import CompletionMode, DeviceConfig, Scheduler
from agent.contract.wire import DeviceClass
from agent.contract.workloads import IOEngine, IOPattern, WorkloadSpec

Features = dict[str, float]

READS = {IOPattern.RANDREAD, IOPattern.READ}
WRITES = {IOPattern.RANDWRITE, IOPattern.WRITE}


@dataclass(frozen=True)
class DeviceFacts:
    """What the learning needs to know of a device, from its inventory and measurements."""

    device_class: DeviceClass
    rotational: bool = False
    hw_queues: int = 1
    qd1_read_us: float | None = None  # measured QD1 4 KiB random-read latency
    write_over_read: float | None = None  # standalone write cost over read cost
    parallel_speedup: float | None = None  # IOPS at QD16 over QD1 (dataset.SPEEDUP_DEPTH)
    poll_queues: int = 0
    hybrid_poll: bool = False  # the kernel offers hybrid polling (before 6.4)

    @classmethod
    def from_inventory(
        cls, device: Mapping[str, Any], measured: Mapping[str, float]
    ) -> DeviceFacts:
        capabilities = device.get("capabilities") or {}
        poll = capabilities.get("poll") or {}
        return cls(
            device_class=DeviceClass(device.get("device_class", "unknown")),
            rotational=bool(device.get("rotational", False)),
            hw_queues=int(capabilities.get("nr_hw_queues") or 1),
            qd1_read_us=measured.get("qd1_read_us"),
            write_over_read=measured.get("write_over_read"),
            parallel_speedup=measured.get("parallel_speedup"),
            poll_queues=int(poll.get("poll_queues") or 0),
            hybrid_poll=bool(poll.get("hybrid_supported")),
        )


def device_features(device: DeviceFacts) -> Features:
    features: Features = {f"class={c.value}": float(device.device_class is c) for c in DeviceClass}
    features.update(
        rotational=float(device.rotational),
        hw_queues=float(device.hw_queues),
        qd1_read_us=device.qd1_read_us if device.qd1_read_us is not None else -1.0,
        write_over_read=device.write_over_read if device.write_over_read is not None else -1.0,
        parallel_speedup=device.parallel_speedup if device.parallel_speedup is not None else -1.0,
        poll_queues=float(device.poll_queues),
    )
    return features


def workload_features(workload: WorkloadSpec) -> Features:
    """Read share, mean request size, queue depth, tasks, thinktime, sync — weighted by each
    job's share of the tasks. db_bench counts as a mixed, mostly-read, synchronous workload."""
    if workload.tool == "db_bench" or not workload.jobs:
        return {
            "read_share": 0.9,
            "request_kib": 4.0,
            "queue_depth": 1.0,
            "tasks": 1.0,
            "thinktime_us": 0.0,
            "sync": 1.0,
            "writer_tasks": 0.0,
            "reader_tasks": 1.0,
        }
    tasks = sum(job.tasks for job in workload.jobs)
    features: Features = dict.fromkeys(
        ("read_share", "request_kib", "queue_depth", "thinktime_us"), 0.0
    )
    readers = writers = 0
    for job in workload.jobs:
        weight = job.tasks / tasks
        share = job.read_share
        features["read_share"] += weight * share
        size = sum(size * percent for size, percent in job.block_sizes.items()) / 100
        features["request_kib"] += weight * size / 1024
        features["queue_depth"] += weight * job.queue_depth
        features["thinktime_us"] += weight * job.thinktime_us
        readers += job.tasks if share > 0 else 0
        writers += job.tasks if share < 1 else 0
    sync = workload.engine is IOEngine.PSYNC or all(j.queue_depth == 1 for j in workload.jobs)
    features.update(
        tasks=float(tasks),
        sync=float(sync),
        reader_tasks=float(readers),
        writer_tasks=float(writers),
    )
    return features


TUNABLES = (  # the parameters learned across schedulers; absent ones are -1
    "slice_idle_us",
    "low_latency",
    "read_expire",
    "write_expire",
    "fifo_batch",
    "writes_starved",
    "read_lat_nsec",
    "write_lat_nsec",
    "alpha_permille",
    "read_preference",
    "timeslice_us",
)


def config_features(config: DeviceConfig) -> Features:
    scheduler = config.scheduler or Scheduler.NONE
    completion = config.completion or CompletionMode.INTERRUPT
    features: Features = {f"scheduler={s.value}": float(scheduler is s) for s in Scheduler}
    features.update({f"completion={m.value}": float(completion is m) for m in CompletionMode})
    # hybrid polling is polling: a model that has seen classic polling knows something of it
    features["polled"] = float(completion is not CompletionMode.INTERRUPT)
    tunables = config.scheduler_tunables
    if scheduler is Scheduler.BFQ and "slice_idle_us" not in tunables and "slice_idle" in tunables:
        tunables = {**tunables, "slice_idle_us": tunables["slice_idle"] * 1000}
    fios_calibrated = all(
        tunables.get(f"cost_{k}_ns", 0) > 0
        for k in ("read_4k", "read_128k", "write_4k", "write_128k")
    )
    features.update({f"t_{name}": float(tunables.get(name, -1)) for name in TUNABLES})
    features["t_fios_calibrated"] = float(scheduler is Scheduler.FIOS and fios_calibrated)
    features["nr_requests"] = float(config.nr_requests or -1)
    return features


def config_key(config: DeviceConfig) -> str:
    """A stable name of a configuration (what makes two runs the same cell)."""
    tunables = ",".join(
        f"{k}={v}"
        for k, v in sorted(config.scheduler_tunables.items())
        if not k.startswith("cost_")
    )
    scheduler = (config.scheduler or Scheduler.NONE).value
    completion = (config.completion or CompletionMode.INTERRUPT).value
    return f"{scheduler}[{tunables}]/{completion}"


COMPLETION_LABELS = {
    CompletionMode.INTERRUPT: "",
    CompletionMode.CLASSIC_POLL: " with classic polling",
    CompletionMode.HYBRID_POLL: " with hybrid polling",
}


def config_label(config: DeviceConfig) -> str:
    """A configuration as an operator reads it: `mq-deadline (fifo_batch=8, read_expire=100)
    with classic polling`; interrupt completion, the default, goes unsaid."""
    scheduler = (config.scheduler or Scheduler.NONE).value
    tunables = ", ".join(
        f"{k}={v}"
        for k, v in sorted(config.scheduler_tunables.items())
        if not k.startswith("cost_")
    )
    queue = {"nr_requests": config.nr_requests, "read_ahead_kb": config.read_ahead_kb}
    limits = ", ".join(f"{name}={value}" for name, value in queue.items() if value is not None)
    text = scheduler + (f" ({tunables})" if tunables else "")
    text += f"; {limits}" if limits else ""
    return text + COMPLETION_LABELS[config.completion or CompletionMode.INTERRUPT]


def row(device: DeviceFacts, workload: WorkloadSpec, config: DeviceConfig) -> Features:
    return {**device_features(device), **workload_features(workload), **config_features(config)}
