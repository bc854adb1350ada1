"""Measuring ground-truth grids (models.grid.Grid): the workloads every grid runs, and how each
kind of device is measured — this host's loop devices (`host`) and the kernel lab's test
devices under QEMU (`lab`)."""

from __future__ import annotations

from agent.bench.library import library
from agent.contract.workloads import WorkloadSpec

# Eight workloads that pull the decision in different directions: QD1 reads (added latency
# matters), deep reads (parallel issue), QD1 writes (asymmetry), deep mixed reads and writes
# from one task (reads blocked behind writes in the queue), four mixed tasks, and the FIOS
# paper's cases (reader against writer, with think time, small reads against large ones:
# fairness, anticipation). The first three also give every device the facts the models use
# (QD1 read latency, write/read asymmetry, parallel speed-up).
GRID_WORKLOADS = (
    "hs23-single-randread-4k-qd1",
    "hs23-single-randread-4k-qd16",
    "hs23-single-randwrite-4k-qd1",
    "hs23-single-randrw50-4k-qd16",
    "hs23-multi-randrw50-4k-p4",
    "fios-1r1w",
    "fios-4r4w-think",
    "fios-4k-vs-128k",
)


def grid_workloads(seconds: float, warmup_s: float = 0.3) -> list[WorkloadSpec]:
    known = library()
    return [
        known[name].model_copy(update={"duration_s": seconds, "warmup_s": warmup_s})
        for name in GRID_WORKLOADS
    ]
