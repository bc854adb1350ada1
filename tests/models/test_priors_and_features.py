"""Feature rows line up whatever they are built from; the papers' priors apply where the papers
say and nowhere else."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from agent.bench.library import library
from agent.contract.tunables import CompletionMode, DeviceConfig, Scheduler
from agent.contract.wire import DeviceClass
from models.dataset import Sample
from models.features import DeviceFacts, config_features, row, workload_features
from models.priors import Objective, priors_for

WORKLOADS = library()
ULL = DeviceFacts(DeviceClass.ULL, qd1_read_us=8.0, poll_queues=1)
FLASH = DeviceFacts(DeviceClass.NVME_FLASH, qd1_read_us=80.0, poll_queues=1)
HDD = DeviceFacts(DeviceClass.HDD, rotational=True)


def test_rows_have_one_set_of_columns() -> None:
    configs = [
        DeviceConfig(),
        DeviceConfig(scheduler=Scheduler.BFQ, scheduler_tunables={"slice_idle": 0}),
        DeviceConfig(scheduler=Scheduler.FIOS, scheduler_tunables={"alpha_permille": 300}),
        DeviceConfig(scheduler=Scheduler.NONE, completion=CompletionMode.CLASSIC_POLL),
    ]
    rows = [
        row(device, workload, config)
        for device in (ULL, FLASH, HDD)
        for workload in list(WORKLOADS.values())[:20]
        for config in configs
    ]
    assert len({tuple(sorted(r)) for r in rows}) == 1
    bfq = config_features(configs[1])
    assert bfq["t_slice_idle_us"] == 0  # ms tunable mapped onto the µs one
    assert bfq["scheduler=bfq"] == 1
    assert config_features(configs[0])["completion=interrupt"] == 1


def test_workload_features_follow_the_jobs() -> None:
    mixed = workload_features(WORKLOADS["fios-4r4w"])
    assert (mixed["tasks"], mixed["reader_tasks"], mixed["writer_tasks"]) == (8, 4, 4)
    assert mixed["read_share"] == 0.5
    assert mixed["sync"] == 1
    large = workload_features(WORKLOADS["fios-4k-vs-128k"])
    assert large["request_kib"] == (4 + 128) / 2


def test_priors_apply_where_their_papers_say() -> None:
    qd1 = workload_features(WORKLOADS["hs23-single-randread-4k-qd1"])
    shared = workload_features(WORKLOADS["fios-4r4w"])

    ull = priors_for(ULL, qd1, Objective.P50)
    assert ull[0].name == "none-on-ull"
    assert "HotStorage '23" in ull[0].citation
    assert "classic-poll-small-reads" in {p.name for p in ull}

    energy = {p.name: p for p in priors_for(FLASH, qd1, Objective.ENERGY)}
    assert energy["no-hybrid-poll-for-energy"].avoid

    fair = priors_for(FLASH, shared, Objective.FAIRNESS)
    assert [p.name for p in fair] == ["fios-shared-flash"]
    assert fair[0].config.scheduler is Scheduler.FIOS
    # the same mix on an ULL device, or for throughput, does not call for FIOS
    assert "fios-shared-flash" not in {p.name for p in priors_for(ULL, shared, Objective.FAIRNESS)}
    assert not priors_for(FLASH, shared, Objective.IOPS)

    hdd = priors_for(HDD, qd1, Objective.P99)
    assert [p.name for p in hdd] == ["bfq-low-latency-interactive-hdd"]
    assert hdd[0].config.scheduler_tunables == {"low_latency": 1}


def test_measured_and_estimated_energy_are_two_objectives() -> None:
    """A run that carries both a meter's joules and an estimate from CPU time teaches each
    objective its own number; a run with only one of them teaches only that objective."""
    workload = WORKLOADS["hs23-single-randread-4k-qd1"]

    def sample(metrics: dict[str, float]) -> Sample:
        return Sample(uuid.uuid4(), {}, workload, DeviceConfig(), metrics, datetime.now(UTC))

    both = sample({"joules_per_mio": 12.0, "joules_per_mio_estimated": 30.0})
    assert both.value(Objective.ENERGY) == 12.0
    assert both.value(Objective.ENERGY_ESTIMATED) == 30.0
    estimated_only = sample({"joules_per_mio_estimated": 30.0})
    assert estimated_only.value(Objective.ENERGY) is None
    assert sample({"joules_per_mio": 12.0}).value(Objective.ENERGY_ESTIMATED) is None
    # the objective's name fits the model and recommendation tables' String(16) columns
    assert all(len(o.value) <= 16 for o in Objective)

    # the papers' energy advice holds whichever way the energy is known
    qd1 = workload_features(workload)
    for objective in (Objective.ENERGY, Objective.ENERGY_ESTIMATED):
        names = {p.name for p in priors_for(FLASH, qd1, objective)}
        assert {"classic-poll-small-reads", "no-hybrid-poll-for-energy"} <= names
    assert "no-hybrid-poll-for-energy" not in {
        p.name for p in priors_for(FLASH, qd1, Objective.P50)
    }
