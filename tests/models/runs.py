"""Small real runs the model tests measure on loop devices: short fio workloads, and each stock
scheduler at its kernel defaults (named as the candidate grid names them)."""

from __future__ import annotations

from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.workloads import IOEngine, IOPattern, JobSpec, WorkloadSpec

STOCK_DEFAULTS = {
    Scheduler.NONE: DeviceConfig(scheduler=Scheduler.NONE),
    Scheduler.MQ_DEADLINE: DeviceConfig(
        scheduler=Scheduler.MQ_DEADLINE,
        scheduler_tunables={"read_expire": 500, "fifo_batch": 16, "writes_starved": 2},
    ),
    Scheduler.KYBER: DeviceConfig(
        scheduler=Scheduler.KYBER,
        scheduler_tunables={"read_lat_nsec": 2_000_000, "write_lat_nsec": 10_000_000},
    ),
    Scheduler.BFQ: DeviceConfig(
        scheduler=Scheduler.BFQ, scheduler_tunables={"slice_idle_us": 8_000, "low_latency": 1}
    ),
}


def fio_workload(name: str, pattern: IOPattern, depth: int) -> WorkloadSpec:
    share = 1.0 if pattern is IOPattern.RANDREAD else 0.0
    job = JobSpec(name="j", pattern=pattern, read_share=share, queue_depth=depth)
    return WorkloadSpec(name=name, engine=IOEngine.IO_URING, jobs=[job], duration_s=0.3)


WORKLOADS = [
    fio_workload("read-qd1", IOPattern.RANDREAD, 1),
    fio_workload("read-qd8", IOPattern.RANDREAD, 8),
    fio_workload("write-qd1", IOPattern.RANDWRITE, 1),
]
