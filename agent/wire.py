"""Wire schemas: what agents and the service say to each other.

This is the one module of the agent that the service and the learning code import. It holds
the protocol (enrollment, inventory, telemetry, observations, policies, applied state) and
the allow-list of tunable attributes with their value ranges, so that a policy the service
accepts is exactly a change the agent may make.
"""

from __future__ import annotations

import math
import re
import uuid
from datetime import timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    model_validator,
)

MAX_WINDOWS_PER_BATCH = 5_000
MAX_WINDOW_SPAN = timedelta(hours=1)
MAX_DEVICES_PER_NODE = 1_024
INT64_MAX = 2**63 - 1

# A counter: what the kernel counts in 64 bits, and what PostgreSQL's BIGINT holds.
Counter = Annotated[int, Field(ge=0, le=INT64_MAX)]


def reject_nul(value: object) -> None:
    """NUL characters cannot be stored in PostgreSQL text and mean nothing in a device's world."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("text must not contain NUL (\\u0000) characters")
    elif isinstance(value, dict):
        for key, item in value.items():
            reject_nul(key)
            reject_nul(item)
    elif isinstance(value, list | tuple):
        for item in value:
            reject_nul(item)


def _no_nul(value: str) -> str:
    reject_nul(value)
    return value


# Free text from outside (query strings, names): bounded and storable.
SafeText = Annotated[str, AfterValidator(_no_nul), Field(max_length=255)]


class InputModel(BaseModel):
    """What comes in from the network: unknown fields, NaN, infinities and NUL are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_nul_anywhere(cls, data: Any) -> Any:
        reject_nul(data)
        return data


class WireModel(InputModel):
    """Strict base of the protocol's messages."""


class DeviceClass(StrEnum):
    HDD = "hdd"
    SATA_SSD = "sata_ssd"
    NVME_FLASH = "nvme_flash"
    ULL = "ull"  # QD1 4 KB random-read median under 10 µs (HotStorage '23 definition)
    VIRTUAL = "virtual"
    UNKNOWN = "unknown"


class Scheduler(StrEnum):
    NONE = "none"
    MQ_DEADLINE = "mq-deadline"
    KYBER = "kyber"
    BFQ = "bfq"
    FIOS = "fios"


class CompletionMode(StrEnum):
    INTERRUPT = "interrupt"
    CLASSIC_POLL = "classic_poll"
    HYBRID_POLL = "hybrid_poll"


class Transport(StrEnum):
    NVME = "nvme"
    SATA = "sata"
    SCSI = "scsi"
    VIRTIO = "virtio"
    LOOP = "loop"
    MMC = "mmc"
    NULL_BLK = "null_blk"
    OTHER = "other"


# --- The allow-list -----------------------------------------------------------------------
# Every attribute blkpilot may write, with the inclusive range of values it may write.
# Units are the kernel's own (the attribute's name says them where the kernel's does).

SCHEDULER_TUNABLES: dict[Scheduler, dict[str, tuple[int, int]]] = {
    Scheduler.NONE: {},
    Scheduler.MQ_DEADLINE: {
        "read_expire": (1, 60_000),  # ms
        "write_expire": (1, 60_000),  # ms
        "fifo_batch": (1, 1_024),
        "writes_starved": (0, 64),
        "front_merges": (0, 1),
        "async_depth": (1, 65_536),
        "prio_aging_expire": (0, 600_000),  # ms
    },
    Scheduler.KYBER: {
        "read_lat_nsec": (1_000, 1_000_000_000),
        "write_lat_nsec": (1_000, 1_000_000_000),
    },
    Scheduler.BFQ: {
        "slice_idle": (0, 1_000),  # ms
        "slice_idle_us": (0, 1_000_000),
        "low_latency": (0, 1),
        "timeout_sync": (1, 1_000),  # ms
        "strict_guarantees": (0, 1),
        "back_seek_max": (0, 1_048_576),  # KiB
        "back_seek_penalty": (1, 1_000),
        "fifo_expire_sync": (1, 10_000),  # ms
        "fifo_expire_async": (1, 10_000),  # ms
        "max_budget": (0, 1_048_576),  # sectors; 0 = auto-tuned
    },
    Scheduler.FIOS: {
        "alpha_permille": (0, 990),  # anticipation bound T_service * alpha / (1 - alpha)
        "timeslice_us": (100, 1_000_000),
        "read_preference": (0, 1),
        "max_depth": (1, 256),
        "cost_read_4k_ns": (0, 100_000_000),
        "cost_read_128k_ns": (0, 100_000_000),
        "cost_write_4k_ns": (0, 100_000_000),
        "cost_write_128k_ns": (0, 100_000_000),
    },
}

QUEUE_LIMITS: dict[str, tuple[int, int]] = {
    "nr_requests": (4, 65_536),
    "read_ahead_kb": (0, 65_536),
    "io_poll_delay": (-1, 1_000_000),  # -1 classic, 0 adaptive hybrid, >0 fixed sleep (µs)
}


def _in_range(name: str, value: int, limits: tuple[int, int]) -> None:
    low, high = limits
    if not low <= value <= high:
        raise ValueError(f"{name}={value} is outside the allowed range [{low}, {high}]")


def _queue_limit(name: str) -> Any:
    low, high = QUEUE_LIMITS[name]
    return Field(default=None, ge=low, le=high)


class DeviceConfig(WireModel):
    """A configuration of one device: what a policy asks for and what an agent reports."""

    scheduler: Scheduler | None = None
    scheduler_tunables: dict[str, int] = Field(default_factory=dict)
    nr_requests: int | None = _queue_limit("nr_requests")
    read_ahead_kb: int | None = _queue_limit("read_ahead_kb")
    completion: CompletionMode | None = None

    @model_validator(mode="after")
    def _tunables_on_allow_list(self) -> Self:
        if self.scheduler_tunables and self.scheduler is None:
            raise ValueError("scheduler_tunables need a scheduler to belong to")
        if self.scheduler is None:
            return self
        allowed = SCHEDULER_TUNABLES[self.scheduler]
        for name, value in self.scheduler_tunables.items():
            if name not in allowed:
                known = ", ".join(sorted(allowed)) or "none"
                raise ValueError(
                    f"{self.scheduler.value} has no tunable {name!r} on the allow-list"
                    f" (allowed: {known})"
                )
            _in_range(name, value, allowed[name])
        return self


# --- Enrollment and inventory ------------------------------------------------------------

_DEVICE_NAME = re.compile(r"^[a-z][a-z0-9_.:!-]{0,63}$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_./-]{0,62}$")


def _labels(value: dict[str, str]) -> dict[str, str]:
    if len(value) > 64:
        raise ValueError("at most 64 labels")
    for key, label in value.items():
        if not _LABEL_KEY.match(key):
            raise ValueError(f"label key {key!r} must match {_LABEL_KEY.pattern}")
        if len(label) > 255:
            raise ValueError(f"label {key!r} is longer than 255 characters")
    return value


DeviceName = Annotated[
    str, Field(pattern=_DEVICE_NAME.pattern, description="kernel name: sda, nvme0n1, loop0, dm-0")
]
Labels = Annotated[dict[str, str], AfterValidator(_labels)]
Hostname = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
]
ShortText = Annotated[str, Field(max_length=255)]


class EnrollRequest(WireModel):
    enrollment_token: Annotated[str, Field(min_length=8, max_length=200)]
    hostname: Hostname
    labels: Labels = Field(default_factory=dict)
    agent_version: ShortText = ""
    kernel_version: ShortText = ""


class EnrollResponse(WireModel):
    node_id: uuid.UUID
    node_token: str


class Heartbeat(WireModel):
    agent_version: ShortText | None = None
    kernel_version: ShortText | None = None


class PollCapabilities(WireModel):
    io_poll: bool | None = None  # queue/io_poll as read; writes are ignored since 5.16
    io_poll_delay: int | None = None
    poll_queues: NonNegativeInt | None = None  # driver poll queues (nvme.poll_queues, null_blk)
    hybrid_supported: bool = False  # only before 6.4
    io_poll_writes_honoured: bool = False  # only before 5.16; later, poll queues decide


class DeviceCapabilities(WireModel):
    available_schedulers: list[Scheduler] = Field(default_factory=list, max_length=16)
    current_scheduler: Scheduler | None = None
    scheduler_tunables: dict[str, int] = Field(default_factory=dict)
    nr_requests: NonNegativeInt | None = None
    read_ahead_kb: NonNegativeInt | None = None
    nr_hw_queues: NonNegativeInt | None = None
    logical_block_size: NonNegativeInt | None = None
    physical_block_size: NonNegativeInt | None = None
    wbt_lat_usec: int | None = None
    poll: PollCapabilities = Field(default_factory=PollCapabilities)
    kernel_version: ShortText = ""

    @model_validator(mode="after")
    def _current_is_available(self) -> Self:
        if (
            self.current_scheduler is not None
            and self.available_schedulers
            and self.current_scheduler not in self.available_schedulers
        ):
            raise ValueError(
                f"current_scheduler {self.current_scheduler.value} is not among"
                " available_schedulers"
            )
        return self


class DeviceInventory(WireModel):
    name: DeviceName
    model: ShortText = ""
    serial: ShortText = ""
    wwid: ShortText = ""
    transport: Transport = Transport.OTHER
    device_class: DeviceClass = DeviceClass.UNKNOWN
    class_evidence: list[ShortText] = Field(default_factory=list, max_length=32)
    rotational: bool = False
    size_bytes: Counter = 0
    holds_data: bool = True  # the safe default: unknown means "do not write"
    holds_data_reasons: list[ShortText] = Field(default_factory=list, max_length=32)
    capabilities: DeviceCapabilities = Field(default_factory=DeviceCapabilities)


class InventoryReport(WireModel):
    kernel_version: ShortText = ""
    devices: list[DeviceInventory] = Field(max_length=MAX_DEVICES_PER_NODE)

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        names = [device.name for device in self.devices]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"device names reported twice: {', '.join(duplicated)}")
        return self


# --- Telemetry --------------------------------------------------------------------------


class PowerScope(StrEnum):
    CPU_PACKAGE = "cpu_package"
    DRAM = "dram"
    SYSTEM = "system"


class PowerSource(StrEnum):
    RAPL = "rapl"
    HWMON = "hwmon"
    IPMI = "ipmi"
    REDFISH = "redfish"
    METER = "meter"


class PowerReading(WireModel):
    """One power source over the window."""

    source: PowerSource
    zone: Annotated[str, Field(max_length=128)]
    scope: PowerScope
    watts: NonNegativeFloat
    energy_joules: NonNegativeFloat


class TelemetryWindow(WireModel):
    """One device over one interval, from /proc/diskstats deltas, /proc/stat and the node's
    power sources. power_* is the reading that speaks for the node (the widest scope);
    power_readings has every source. Power is absent, never invented, without a source."""

    device: DeviceName
    start: AwareDatetime
    end: AwareDatetime
    read_ios: Counter
    write_ios: Counter
    read_bytes: Counter
    write_bytes: Counter
    iops: NonNegativeFloat
    read_share: Annotated[float, Field(ge=0.0, le=1.0)]
    mean_request_bytes: NonNegativeFloat
    mean_latency_us: NonNegativeFloat
    queue_depth: NonNegativeFloat
    utilisation: Annotated[float, Field(ge=0.0, le=1.0)]
    cpu_utilisation: Annotated[float | None, Field(ge=0.0, le=1.0)] = None  # the node's
    context_switches_per_s: NonNegativeFloat | None = None  # the node's
    power_watts: NonNegativeFloat | None = None
    energy_joules: NonNegativeFloat | None = None
    power_scope: PowerScope | None = None
    power_source: PowerSource | None = None
    power_readings: list[PowerReading] = Field(default_factory=list, max_length=32)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        span = self.end - self.start
        if span <= timedelta(0):
            raise ValueError("end must be after start")
        if span > MAX_WINDOW_SPAN:
            raise ValueError(f"a window spans at most {MAX_WINDOW_SPAN}")
        has_power = self.power_watts is not None or self.energy_joules is not None
        if has_power and self.power_scope is None:
            raise ValueError("power readings need a power_scope (what they measure)")
        if not has_power and self.power_scope is not None:
            raise ValueError("power_scope given without a power reading")
        return self


class TelemetryBatch(WireModel):
    batch_id: uuid.UUID
    windows: list[TelemetryWindow] = Field(min_length=1, max_length=MAX_WINDOWS_PER_BATCH)


class TelemetryBatchReceipt(WireModel):
    batch_id: uuid.UUID
    accepted: bool  # False: this batch id was ingested before; nothing was stored again
    windows: int


# --- Observations, policies, applied state ------------------------------------------------


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
    tool: Literal["fio", "db_bench"] = "fio"
    engine: IOEngine = IOEngine.IO_URING
    jobs: list[JobSpec] = Field(default_factory=list, max_length=16)
    db_bench: DbBenchSpec | None = None
    duration_s: Annotated[float, Field(gt=0, le=86_400)] = 10.0
    warmup_s: Annotated[float, Field(ge=0, le=3_600)] = 0.0

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.tool == "fio" and not self.jobs:
            raise ValueError("a fio workload needs at least one job")
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


class CanaryDone(InputModel):
    """A node ran a scheduled canary; its canary observation closes it."""

    observation_id: uuid.UUID


class ObservationKind(StrEnum):
    BENCHMARK = "benchmark"
    CANARY = "canary"


class CanaryVerdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


_METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def _metrics(value: dict[str, float]) -> dict[str, float]:
    if not value:
        raise ValueError("at least one metric")
    if len(value) > 256:
        raise ValueError("at most 256 metrics")
    for name, number in value.items():
        if not _METRIC_NAME.match(name):
            raise ValueError(f"metric name {name!r} must match {_METRIC_NAME.pattern}")
        if not math.isfinite(number):
            raise ValueError(f"metric {name} is not a finite number")
    return value


Metrics = Annotated[dict[str, float], AfterValidator(_metrics)]


class ObservationCreate(WireModel):
    device_id: uuid.UUID
    kind: ObservationKind
    tool: Literal["fio", "db_bench", "probe"]
    workload: WorkloadSpec
    configuration: DeviceConfig
    metrics: Metrics
    started_at: AwareDatetime
    finished_at: AwareDatetime
    verdict: CanaryVerdict | None = None
    statistics: dict[str, float] = Field(default_factory=dict, max_length=512)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.finished_at < self.started_at:
            raise ValueError("finished_at is before started_at")
        if (self.kind is ObservationKind.CANARY) != (self.verdict is not None):
            raise ValueError("a canary observation has a verdict, a benchmark has none")
        bad = [name for name, number in self.statistics.items() if not math.isfinite(number)]
        if bad:
            raise ValueError(f"statistics not finite: {', '.join(bad)}")
        return self


class AppliedStatus(StrEnum):
    APPLIED = "applied"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    DRIFT = "drift"


class AppliedStateReport(WireModel):
    policy_version: NonNegativeInt
    status: AppliedStatus
    config: DeviceConfig
    detail: Annotated[str, Field(max_length=2_000)] = ""


def parse_kernel_version(release: str) -> tuple[int, int]:
    """'6.1.0-18-amd64' -> (6, 1); unknown strings -> (0, 0)."""
    match = re.match(r"^(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
