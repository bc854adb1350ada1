"""The allow-list: every sysfs attribute blkpilot may write, with the inclusive range of values
it may write, and the device configuration built from it — so that a policy the service accepts
is exactly a change the agent may make."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import AfterValidator, Field, StrictInt, model_validator

from agent.contract.base import WireModel


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

# Tunables the kernel keeps in jiffies and shows in ms: a value reads back rounded up to the
# next tick (HZ 250: read_expire 250 -> 252, timeout_sync 125 -> 128). The rest are exact.
JIFFY_TUNABLES: dict[Scheduler, frozenset[str]] = {
    Scheduler.MQ_DEADLINE: frozenset({"read_expire", "write_expire", "prio_aging_expire"}),
    Scheduler.BFQ: frozenset({"timeout_sync"}),
}
KERNEL_HZ = (100, 250, 300, 1000)  # CONFIG_HZ's choices


def jiffy_readback(ms: int, hz: int) -> int:
    """What the kernel shows after `ms` was written to a jiffies tunable: msecs_to_jiffies
    rounds up, jiffies_to_msecs rounds down (include/linux/jiffies.h)."""
    jiffies = -(-ms * hz // 1000)
    return jiffies * 1000 // hz


def jiffy_readbacks(ms: int, hz: int | None = None) -> set[int]:
    """The read-backs `ms` can have: at this HZ, or at any of CONFIG_HZ's when not known."""
    return {jiffy_readback(ms, h) for h in ((hz,) if hz else KERNEL_HZ)}


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
    return Field(default=None, ge=low, le=high, strict=True)  # 64, not "64"


class DeviceConfig(WireModel):
    """A configuration of one device: what a policy asks for and what an agent reports."""

    scheduler: Scheduler | None = None
    scheduler_tunables: dict[str, StrictInt] = Field(default_factory=dict)
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


def _asks_for_something(config: DeviceConfig) -> DeviceConfig:
    if config == DeviceConfig():
        raise ValueError(
            "the configuration asks for nothing: name a scheduler, its tunables, nr_requests,"
            " read_ahead_kb or a completion mode"
        )
    return config


# What a policy or a rollout asks a device to run: {} would create a version that changes
# nothing, and an agent would refuse it at every fetch.
# The schema says it too: at least one of these is given, and not null.
_ASKS_FOR = ("scheduler", "nr_requests", "read_ahead_kb", "completion")
WantedConfig = Annotated[
    DeviceConfig,
    AfterValidator(_asks_for_something),
    Field(
        json_schema_extra={
            "anyOf": [
                {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                for name in _ASKS_FOR
            ]
        }
    ),
]
