"""The workload language: fio jobs and db_bench runs as the papers describe them, spoken by
the agent's benchmarks, the canary and the learning code alike."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from agent.contract.base import WireModel


class IOEngine(StrEnum):
    IO_URING = "io_uring"
    IO_URING_POLL = "io_uring_poll"  # IOPOLL: classic polling, where the device has poll queues
    PSYNC = "psync"  # synchronous pread/pwrite
    LIBAIO = "libaio"


class IOPattern(StrEnum):
    RANDREAD = "randread"
    RANDWRITE = "randwrite"
    RANDRW = "randrw"
    READ = "read"
    WRITE = "write"
    RW = "rw"


class Arrival(StrEnum):
    CLOSED = "closed"  # the next I/O follows the last one's completion (plus any thinktime)
    POISSON = "poisson"  # exponential gaps with mean thinktime_us (FIOS's exponential thinktime)


_JOB_NAME = r"^[a-z][a-z0-9_]{0,31}$"
MAX_BLOCK = 64 * 1024 * 1024


class JobSpec(WireModel):
    """One group of identical tasks: fio's job with numjobs."""

    name: Annotated[str, Field(pattern=_JOB_NAME)]
    pattern: IOPattern = IOPattern.RANDREAD
    read_share: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0  # for randrw / rw
    block_sizes: dict[int, int] = Field(
        default_factory=lambda: {4096: 100}, description="bytes -> percent of I/Os"
    )
    queue_depth: Annotated[int, Field(ge=1, le=4_096)] = 1
    tasks: Annotated[int, Field(ge=1, le=256)] = 1
    thinktime_us: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    # with thinktime_us, a pause after this much time issuing I/O instead of a think after
    # every I/O (fio's thinktime_iotime): a reader that stops now and then, say
    thinktime_every_us: Annotated[int, Field(ge=0, le=100_000_000)] = 0
    arrival: Arrival = Arrival.CLOSED

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.block_sizes or len(self.block_sizes) > 16:
            raise ValueError("block_sizes needs 1 to 16 sizes")
        for size in self.block_sizes:
            if size < 512 or size > MAX_BLOCK or size % 512:
                raise ValueError(f"block size {size} is not a multiple of 512 in [512, 64 MiB]")
        if sum(self.block_sizes.values()) != 100 or min(self.block_sizes.values()) <= 0:
            raise ValueError("block_sizes percentages must be positive and add up to 100")
        if self.arrival is Arrival.POISSON and self.thinktime_us == 0:
            raise ValueError("poisson arrivals need a mean thinktime_us")
        if self.thinktime_every_us and (not self.thinktime_us or self.arrival is Arrival.POISSON):
            raise ValueError("thinktime_every_us is a closed-loop job's pause of thinktime_us")
        reads_only = self.pattern in (IOPattern.RANDREAD, IOPattern.READ)
        writes_only = self.pattern in (IOPattern.RANDWRITE, IOPattern.WRITE)
        if (reads_only and self.read_share != 1.0) or (writes_only and self.read_share != 0.0):
            raise ValueError(f"read_share must be {1.0 if reads_only else 0.0} for {self.pattern}")
        return self

    @property
    def writes(self) -> bool:
        return self.read_share < 1.0

    @property
    def mean_block_bytes(self) -> float:
        return sum(size * share for size, share in self.block_sizes.items()) / 100


class DbBenchSpec(WireModel):
    """RocksDB db_bench readrandom, as in the papers: 16-byte keys, 4 KB values, no compression."""

    key_size: Annotated[int, Field(ge=8, le=1_024)] = 16
    value_size: Annotated[int, Field(ge=64, le=1 << 20)] = 4_096
    threads: Annotated[int, Field(ge=1, le=256)] = 1
    fill_fraction: Annotated[float, Field(gt=0, le=0.5)] = 0.25  # of the target's free space
    max_keys: Annotated[int, Field(ge=1_000, le=1_000_000_000)] = 2_000_000


class WorkloadSpec(WireModel):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    tool: Literal["fio", "db_bench", "live"] = "fio"  # live: a device's own traffic, described
    engine: IOEngine = IOEngine.IO_URING
    jobs: list[JobSpec] = Field(default_factory=list, max_length=16)
    db_bench: DbBenchSpec | None = None
    duration_s: Annotated[float, Field(gt=0, le=86_400)] = 10.0
    warmup_s: Annotated[float, Field(ge=0, le=3_600)] = 0.0

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.tool in ("fio", "live") and not self.jobs:
            raise ValueError(f"a {self.tool} workload needs at least one job")
        if self.tool == "db_bench" and (self.db_bench is None or self.jobs):
            raise ValueError("a db_bench workload has db_bench settings and no fio jobs")
        names = [job.name for job in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        return self

    @property
    def writes(self) -> bool:
        """Whether it writes to the target (db_bench prepares its database by writing)."""
        return self.tool == "db_bench" or any(job.writes for job in self.jobs)

    @property
    def tasks(self) -> int:
        return sum(job.tasks for job in self.jobs) if self.jobs else 1


_PATTERN_WORDS = {
    IOPattern.RANDREAD: "random reads",
    IOPattern.RANDWRITE: "random writes",
    IOPattern.RANDRW: "random reads and writes",
    IOPattern.READ: "sequential reads",
    IOPattern.WRITE: "sequential writes",
    IOPattern.RW: "sequential reads and writes",
}


def _bytes(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def describe_job(job: JobSpec) -> str:
    """A job as people say it: "4 KiB random reads, one at a time"."""
    sizes = "/".join(_bytes(size) for size in sorted(job.block_sizes))
    depth = "one at a time" if job.queue_depth == 1 else f"{job.queue_depth} at a time"
    text = f"{sizes} {_PATTERN_WORDS[job.pattern]}, {depth}"
    if job.pattern in (IOPattern.RANDRW, IOPattern.RW):
        text += f" ({job.read_share:.0%} reads)"
    if job.tasks > 1:
        text += f", {job.tasks} tasks"
    if job.thinktime_us:
        text += f", {job.thinktime_us} µs between I/Os"
    return text


def describe(workload: WorkloadSpec) -> str:
    """A workload as people say it, for operators; its code name is shown beside it."""
    if workload.tool == "db_bench" and workload.db_bench is not None:
        spec = workload.db_bench
        threads = "one thread" if spec.threads == 1 else f"{spec.threads} threads"
        return f"RocksDB random reads of {_bytes(spec.value_size)} values, {threads}"
    jobs = " + ".join(describe_job(job) for job in workload.jobs)
    return f"the device's own traffic ({jobs})" if workload.tool == "live" else jobs
