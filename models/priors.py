"""What the papers say, as priors for a cold start.

Each prior names a configuration, when it applies (device and workload features, the
objective), how strongly (in pseudo-observations: a prior worth 3 counts like three measured
runs, so it gives way once real observations of the cell accumulate), a plain-language reason
and the paper it comes from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from agent.contract.metrics import METRICS, Metric
from agent.contract.tunables import CompletionMode, DeviceConfig, Scheduler
from agent.contract.wire import DeviceClass
from models.features import DeviceFacts, Features


class Objective(StrEnum):
    P50 = "p50_latency"
    P99 = "p99_latency"
    IOPS = "iops"
    ENERGY = "energy"  # measured: joules from RAPL or a power meter
    FAIRNESS = "fairness"
    # estimated: the CPU's busy share through a power model, where nothing measures power
    # (agent/collectors/estimate.py); learned apart from measured joules, never mixed with them
    ENERGY_ESTIMATED = "energy_estimated"

    @property
    def is_energy(self) -> bool:
        return self in (Objective.ENERGY, Objective.ENERGY_ESTIMATED)

    @property
    def metric(self) -> Metric:
        """The measured metric the objective is learned on (its log, per device class) and
        judged by: its label, unit and direction — the one definition every view reads."""
        return METRICS[_METRIC_OF[self]]


_METRIC_OF = {
    Objective.P50: "lat_p50_us",
    Objective.P99: "lat_p99_us",
    Objective.IOPS: "iops",
    Objective.ENERGY: "joules_per_mio",
    Objective.FAIRNESS: "worst_slowdown_over_proportional",
    Objective.ENERGY_ESTIMATED: "joules_per_mio_estimated",
}


HS23 = "HotStorage '23, Do We Still Need IO Schedulers for Low-latency Disks?"
HS22 = "HotStorage '22, Polling vs Interrupts: energy and performance on fast SSDs"
SYSTOR12 = "SYSTOR '12, BFQ: responsiveness and throughput on rotational disks"
FAST12 = "FAST '12, FIOS: A Fair, Efficient Flash I/O Scheduler"

FLASH = {DeviceClass.NVME_FLASH, DeviceClass.SATA_SSD}
# HotStorage '22, Table 1: 4 KB random reads at one thread on Optane, classic polling 8.1 µs
# against interrupts' 10.1 µs
HS22_POLL_EFFECT = math.log(10.1 / 8.1)


@dataclass(frozen=True)
class Prior:
    name: str
    config: DeviceConfig
    applies: Callable[[DeviceFacts, Features, Objective], bool]
    strength: float  # pseudo-observations
    reason: str
    citation: str
    avoid: bool = False  # a configuration the paper advises against
    # the effect the paper measured, as a log ratio (None: blkpilot's default, 5 %); the search
    # moves a configuration by at least this before the cell has observations of its own
    effect: float | None = None


def _small_reads(w: Features) -> bool:
    return w["read_share"] >= 0.9 and w["request_kib"] <= 16 and w["queue_depth"] <= 4


def _large_reads(w: Features) -> bool:
    return w["read_share"] >= 0.9 and w["request_kib"] >= 64


def _pollable(d: DeviceFacts) -> bool:
    return d.poll_queues > 0 and d.device_class in (DeviceClass.ULL, *FLASH)


def _one_poller(w: Features) -> bool:
    """A polling task keeps a CPU spinning: several of them can starve each other where CPUs
    are fewer than tasks (the lab, 4 tasks on 1 vCPU: a p99 85 times the best), so the polling
    priors speak only for a single task."""
    return w["tasks"] <= 1


PRIORS: tuple[Prior, ...] = (
    Prior(
        "none-on-ull",
        DeviceConfig(scheduler=Scheduler.NONE),
        lambda d, w, o: d.device_class is DeviceClass.ULL and o is not Objective.FAIRNESS,
        3.0,
        "On ultra-low-latency SSDs every scheduler only adds latency; none adds the least.",
        HS23,
    ),
    Prior(
        "classic-poll-small-reads",
        DeviceConfig(scheduler=Scheduler.NONE, completion=CompletionMode.CLASSIC_POLL),
        lambda d, w, o: (
            _pollable(d)
            and _small_reads(w)
            and _one_poller(w)
            and (o.is_energy or o in (Objective.P50, Objective.P99))
        ),
        2.0,
        "Small synchronous reads on a fast SSD finish sooner and with fewer context switches"
        " when the submitting core polls for them; for energy the shorter wait pays for the"
        " spinning.",
        HS22,
        effect=HS22_POLL_EFFECT,
    ),
    Prior(
        "classic-poll-ull-latency",
        DeviceConfig(scheduler=Scheduler.NONE, completion=CompletionMode.CLASSIC_POLL),
        lambda d, w, o: (
            _pollable(d)
            and d.device_class is DeviceClass.ULL
            and w["request_kib"] <= 16
            and _one_poller(w)
            and o in (Objective.P50, Objective.P99)
        ),
        2.0,
        "On an ultra-low-latency SSD a request completes in a few microseconds, less than the"
        " interrupt and wake-up that report it: polling for small requests, reads or writes,"
        " shortens their latency and its tail.",
        HS22,
        effect=HS22_POLL_EFFECT,
    ),
    Prior(
        "interrupts-large-reads",
        DeviceConfig(scheduler=Scheduler.NONE, completion=CompletionMode.INTERRUPT),
        lambda d, w, o: _pollable(d) and _large_reads(w) and o.is_energy,
        2.0,
        "Large reads take long enough that polling burns a core for little latency gain:"
        " interrupts use less energy.",
        HS22,
    ),
    Prior(
        "no-hybrid-poll-for-energy",
        DeviceConfig(scheduler=Scheduler.NONE, completion=CompletionMode.HYBRID_POLL),
        lambda d, w, o: _pollable(d) and o.is_energy,
        2.0,
        "Hybrid polling sleeps then spins: it saves less than classic polling on latency and"
        " costs more energy than interrupts.",
        HS22,
        avoid=True,
    ),
    Prior(
        "bfq-low-latency-interactive-hdd",
        DeviceConfig(scheduler=Scheduler.BFQ, scheduler_tunables={"low_latency": 1}),
        lambda d, w, o: d.rotational and w["sync"] >= 1 and w["queue_depth"] <= 2,
        3.0,
        "On rotational disks bfq with low_latency keeps interactive, synchronous work"
        " responsive next to background streams, where the others let it starve.",
        SYSTOR12,
    ),
    Prior(
        "fios-shared-flash",
        # the paper's FIOS: anticipation with alpha = 0.5, and read preference on — without
        # anticipation it measured readers unfair again (and so does the lab)
        DeviceConfig(
            scheduler=Scheduler.FIOS,
            scheduler_tunables={"alpha_permille": 500, "read_preference": 1},
        ),
        lambda d, w, o: (
            d.device_class in FLASH
            and w["reader_tasks"] >= 1
            and w["writer_tasks"] >= 1
            and w["tasks"] >= 2
            and o is Objective.FAIRNESS
        ),
        3.0,
        "Readers and writers sharing a flash device: without fair timeslices and read"
        " preference the readers are slowed many times beyond their share; FIOS keeps each"
        " task near its proportional slowdown.",
        FAST12,
    ),
)


def priors_for(
    device: DeviceFacts,
    workload: Features,
    objective: Objective,
    among: Sequence[Prior] | None = None,
) -> list[Prior]:
    """The priors (of `among`, default all) that apply to a cell, strongest first."""
    found = [
        p for p in (PRIORS if among is None else among) if p.applies(device, workload, objective)
    ]
    return sorted(found, key=lambda p: -p.strength)
