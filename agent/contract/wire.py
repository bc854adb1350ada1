"""Wire schemas: what agents and the service say to each other — enrollment, inventory,
telemetry, observations, policies and applied state."""

from __future__ import annotations

import math
import re
import uuid
from datetime import timedelta
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    Field,
    NonNegativeInt,
    model_validator,
)

from agent.contract import histograms
from agent.contract.base import (
    EARLIEST_WINDOW,
    MAX_BYTES_PER_S,
    MAX_DEVICES_PER_NODE,
    MAX_IOPS,
    MAX_IOS_PER_WINDOW,
    MAX_WINDOW_SPAN,
    MAX_WINDOWS_PER_BATCH,
    Bytes,
    Counter,
    Depth,
    InputModel,
    Iops,
    Joules,
    Micros,
    PerSecond,
    Watts,
    WindowBytes,
    WindowIos,
    WireModel,
)
from agent.contract.labels import Labels
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.workloads import WorkloadSpec


class DeviceClass(StrEnum):
    HDD = "hdd"
    SATA_SSD = "sata_ssd"
    NVME_FLASH = "nvme_flash"
    ULL = "ull"  # QD1 4 KB random-read median under 10 µs (HotStorage '23 definition)
    VIRTUAL = "virtual"
    UNKNOWN = "unknown"


class Transport(StrEnum):
    NVME = "nvme"
    SATA = "sata"
    SCSI = "scsi"
    VIRTIO = "virtio"
    LOOP = "loop"
    MMC = "mmc"
    NULL_BLK = "null_blk"
    OTHER = "other"


# --- Enrollment and inventory ------------------------------------------------------------

_DEVICE_NAME = re.compile(r"^[a-z][a-z0-9_.:!-]{0,63}$")

DeviceName = Annotated[
    str, Field(pattern=_DEVICE_NAME.pattern, description="kernel name: sda, nvme0n1, loop0, dm-0")
]
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


class TokenIssued(WireModel):
    """A node token with when it expires and when the agent should renew it."""

    node_token: str
    expires_at: AwareDatetime | None = None  # None: a service from before tokens expired
    renew_after: AwareDatetime | None = None


class EnrollResponse(TokenIssued):
    node_id: uuid.UUID


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


class OwnerKind(StrEnum):
    UDEV = "udev"
    TUNED = "tuned"


class Owner(WireModel):
    """Something else on the node that sets this device's queue attributes (agent.owners): a
    udev rule (`source`: its file and line) or the active TuneD profile (`source`: the profile
    and the file its [disk] settings come from). `settings`: attribute under queue/ (as the
    agent names tunables: scheduler, read_ahead_kb, iosched/…) → the value it sets; `certain`
    False where the rule also matches on something the agent cannot evaluate (a PROGRAM, a
    parent's attribute): it may apply."""

    kind: OwnerKind
    source: ShortText
    settings: dict[ShortText, ShortText] = Field(max_length=16)
    certain: bool = True


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
    # what else sets its queue attributes: udev rules, a TuneD profile (agent.owners)
    owners: list[Owner] = Field(default_factory=list, max_length=16)


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
    # not measured: the node's CPU power estimated from its CPU time (agent.power.CpuPowerModel)
    # where no meter exists; never summed with, or standing in for, a measured reading
    ESTIMATED = "estimated"


class PowerSource(StrEnum):
    RAPL = "rapl"
    HWMON = "hwmon"
    IPMI = "ipmi"
    REDFISH = "redfish"
    METER = "meter"
    ESTIMATE = "estimate"


class PowerReading(WireModel):
    """One power source over the window."""

    source: PowerSource
    zone: Annotated[str, Field(max_length=128)]
    scope: PowerScope
    watts: Watts
    energy_joules: Joules


class IoOperation(StrEnum):
    READ = "read"
    WRITE = "write"
    FLUSH = "flush"
    DISCARD = "discard"
    OTHER = "other"


class LatencySource(StrEnum):
    EBPF = "ebpf"  # per-I/O, from the block tracepoints: distributions and percentiles
    DISKSTATS = "diskstats"  # /proc/diskstats: means only, never a percentile


# (slot, count) pairs of a histogram in agent.contract.histograms' slot schemes; strict, so
# that no text can stand for a number in them ("12" was read as 12): the NUL walk passes
# them by (OperationLatency._text_free_fields)
Histogram = Annotated[
    list[
        tuple[
            Annotated[int, Field(ge=0, strict=True)],
            Annotated[int, Field(gt=0, le=MAX_IOS_PER_WINDOW, strict=True)],
        ]
    ],
    Field(max_length=histograms.LATENCY_SLOTS),
]
# how far an operation's eBPF count may be from diskstats' for the same window: the two are
# read a few milliseconds apart in one collection, and a burst in between lands in one and not
# yet in the other (measured: 74 of 512 reads, 16 devices each read in 256-I/O bursts)
COUNT_SLACK = (1024, 0.10)


class OperationLatency(WireModel):
    """One operation's requests completed in the window: device time (issue to completion),
    queue time (insert to issue) where requests passed through a scheduler's queue, and request
    sizes; the percentiles are the device time's."""

    op: IoOperation
    count: WindowIos
    device_ns: Histogram
    queue_ns: Histogram = Field(default_factory=list)
    size_bytes: Histogram
    p50_us: Micros
    p95_us: Micros
    p99_us: Micros
    p999_us: Micros

    _text_free_fields = frozenset({"device_ns", "queue_ns", "size_bytes"})

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if histograms.check(self.device_ns, histograms.LATENCY_SLOTS) != self.count:
            raise ValueError(f"{self.op}: device_ns counts do not add up to count")
        if histograms.check(self.size_bytes, histograms.SIZE_SLOTS) != self.count:
            raise ValueError(f"{self.op}: size_bytes counts do not add up to count")
        histograms.check(self.queue_ns, histograms.LATENCY_SLOTS)
        given = [self.p50_us, self.p95_us, self.p99_us, self.p999_us]
        if given != sorted(given):
            raise ValueError(f"{self.op}: percentiles must not decrease (p50 <= … <= p99.9)")
        computed = histograms.percentiles_us(self.device_ns)
        for name, value in zip(histograms.PERCENTILES, given, strict=True):
            if abs(computed.get(name, 0.0) - value) > 1e-6 * max(1.0, value):
                raise ValueError(f"{self.op}: {name}_us is not the histogram's")
        return self


# read on every window a batch holds: a module constant is a global lookup, where
# timedelta(0) is an object made each time and an enum member read off its class costs
# ~100 ns (a 500-window batch is checked in ~1.5 ms: service.fastwire)
_NO_TIME = timedelta(0)
_DISKSTATS = LatencySource.DISKSTATS
_READ, _WRITE = IoOperation.READ, IoOperation.WRITE


class TelemetryWindow(WireModel):
    """One device over one interval, from /proc/diskstats deltas, /proc/stat and the node's
    power sources. power_* is the reading that speaks for the node (the widest scope);
    power_readings has every source. Power is absent, never invented, without a source."""

    device: DeviceName
    start: AwareDatetime
    end: AwareDatetime
    read_ios: WindowIos
    write_ios: WindowIos
    read_bytes: WindowBytes
    write_bytes: WindowBytes
    iops: Iops
    read_share: Annotated[float, Field(ge=0.0, le=1.0, strict=True)]
    mean_request_bytes: Bytes
    mean_latency_us: Micros
    queue_depth: Depth
    utilisation: Annotated[float, Field(ge=0.0, le=1.0, strict=True)]
    cpu_utilisation: Annotated[float | None, Field(ge=0.0, le=1.0, strict=True)] = None
    context_switches_per_s: PerSecond | None = None  # the node's
    power_watts: Watts | None = None
    energy_joules: Joules | None = None
    power_scope: PowerScope | None = None
    power_source: PowerSource | None = None
    power_readings: list[PowerReading] = Field(default_factory=list, max_length=32)
    latency_source: LatencySource = LatencySource.DISKSTATS
    latency_note: Annotated[str, Field(max_length=500)] = ""  # why there is no eBPF
    operations: list[OperationLatency] = Field(default_factory=list, max_length=5)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        # reads only the fields, no methods: service.fastwire runs it on its own structs too
        _distributions_consistent(self)
        if self.start < EARLIEST_WINDOW:
            raise ValueError(f"a window starts after {EARLIEST_WINDOW:%Y-%m-%d}")
        span = self.end - self.start
        if span <= _NO_TIME:
            raise ValueError("end must be after start")
        if span > MAX_WINDOW_SPAN:
            raise ValueError(f"a window spans at most {MAX_WINDOW_SPAN}")
        # at most what a device does in the window's span (agent.contract.base), a second
        # at least: counters are read a little apart from the window's clock
        seconds = max(span.total_seconds(), 1.0)
        if self.read_ios + self.write_ios > MAX_IOPS * seconds:
            raise ValueError(
                f"{self.read_ios + self.write_ios} I/Os in {span.total_seconds():g} s is more"
                f" than any device does ({MAX_IOPS:.0e} I/Os per second)"
            )
        if self.read_bytes + self.write_bytes > MAX_BYTES_PER_S * seconds:
            raise ValueError(
                f"{self.read_bytes + self.write_bytes} bytes in {span.total_seconds():g} s is"
                f" more than any device moves ({MAX_BYTES_PER_S:.0e} bytes per second)"
            )
        has_power = self.power_watts is not None or self.energy_joules is not None
        if has_power and self.power_scope is None:
            raise ValueError("power readings need a power_scope (what they measure)")
        if not has_power and self.power_scope is not None:
            raise ValueError("power_scope given without a power reading")
        return self

    def percentiles_us(self) -> dict[str, float | None]:
        """Device-time p50, p99 and p99.9 over reads and writes, from the merged histograms;
        None without eBPF — never a percentile made up from a mean."""
        return window_percentiles_us(self)


def window_percentiles_us(window: TelemetryWindow) -> dict[str, float | None]:
    """TelemetryWindow.percentiles_us, of anything with a window's fields (service.fastwire)."""
    if not window.operations:
        return {"p50_us": None, "p99_us": None, "p999_us": None}
    merged = histograms.merge(o.device_ns for o in window.operations if o.op in (_READ, _WRITE))
    found = histograms.percentiles_us(merged)
    return {f"{name}_us": found.get(name) for name in ("p50", "p99", "p999")}


def _distributions_consistent(window: TelemetryWindow) -> None:
    if window.latency_source is _DISKSTATS:
        if window.operations:
            raise ValueError("a diskstats window carries means only, no distributions")
        return
    # one pass, no generator: this runs on every eBPF window a service ingests
    counts: dict[IoOperation, int] = {}
    for operation in window.operations:
        if operation.op in counts:
            raise ValueError("one entry per operation")
        counts[operation.op] = operation.count
    fixed, share = COUNT_SLACK
    for op, ios in ((_READ, window.read_ios), (_WRITE, window.write_ios)):
        count = counts.get(op, 0)
        if abs(count - ios) > max(fixed, share * ios):
            raise ValueError(f"{op} latency counts {count} I/Os where diskstats counts {ios}")


class TelemetryBatch(WireModel):
    batch_id: uuid.UUID
    windows: list[TelemetryWindow] = Field(min_length=1, max_length=MAX_WINDOWS_PER_BATCH)


class TelemetryBatchReceipt(WireModel):
    batch_id: uuid.UUID
    accepted: bool  # False: this batch id was ingested before; nothing was stored again
    windows: int


# --- Observations, policies, applied state ------------------------------------------------


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
    tool: Literal["fio", "db_bench", "probe", "live"]
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
        if self.started_at < EARLIEST_WINDOW:
            # like telemetry: a measurement from before this project's world is a wrong clock
            raise ValueError(f"started_at is before {EARLIEST_WINDOW:%Y-%m-%d}")
        if (self.kind is ObservationKind.CANARY) != (self.verdict is not None):
            raise ValueError("a canary observation has a verdict, a benchmark has none")
        bad = [name for name, number in self.statistics.items() if not math.isfinite(number)]
        if bad:
            raise ValueError(f"statistics not finite: {', '.join(bad)}")
        return self


class OwnerPolicy(StrEnum):
    """What blkpilot does where another owner (a udev rule, a TuneD profile: agent.owners) sets
    an attribute its policy sets too."""

    # applies, and where the other owner sets it back, applies again once per change and says
    # whose change it undid (today's behaviour, and the default)
    TAKE_OVER = "take_over"
    # the other owner's setting stands: the policy is not applied while one certainly sets an
    # attribute it sets; the agent says so (status yielded) and blkpilot only recommends
    YIELD = "yield"


class AppliedStatus(StrEnum):
    APPLIED = "applied"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    DRIFT = "drift"
    PAUSED = "paused"  # rolled back by hand on the node: held there until the policy changes
    YIELDED = "yielded"  # not applied: another owner sets the same attribute (OwnerPolicy.YIELD)


class AppliedStateReport(WireModel):
    policy_version: NonNegativeInt
    status: AppliedStatus
    config: DeviceConfig
    detail: Annotated[str, Field(max_length=2_000)] = ""


def parse_kernel_version(release: str) -> tuple[int, int]:
    """'6.1.0-18-amd64' -> (6, 1); unknown strings -> (0, 0)."""
    match = re.match(r"^(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
