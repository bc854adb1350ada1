"""Training samples from real observations: fio runs on a real loop device, recorded through
the API into PostgreSQL, read back with the device's measured facts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from agent.bench.measure import measure
from agent.bench.report import benchmark_observation
from agent.bench.target import device_target
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.workloads import IOEngine, IOPattern, JobSpec, WorkloadSpec
from agent.host import HostPaths
from models import dataset, evaluate
from models.features import row
from models.grid import Grid, GridDevice
from models.priors import Objective
from service.recommendations.nightly import load_samples
from tests.agent.conftest import LoopFactory
from tests.factories import bearer, create_node, device_inventory, report_inventory
from tests.models.runs import fio_workload


def _spec(name: str, pattern: IOPattern, depth: int) -> WorkloadSpec:
    job = JobSpec(
        name="j",
        pattern=pattern,
        read_share=1.0 if pattern is IOPattern.RANDREAD else 0.0,
        queue_depth=depth,
    )
    engine = IOEngine.PSYNC if depth == 1 else IOEngine.IO_URING
    return WorkloadSpec(name=name, engine=engine, jobs=[job], duration_s=0.5)


def test_samples_and_measured_facts_from_real_runs(
    client: TestClient, session: Session, loop_device: LoopFactory, tmp_path: Path
) -> None:
    name = loop_device(size_mb=64)
    node, token = create_node(session)
    (device,) = report_inventory(session, node, device_inventory(name))
    target = device_target(HostPaths(), name)
    runs = [
        (_spec("r-qd1", IOPattern.RANDREAD, 1), DeviceConfig(scheduler=Scheduler.NONE)),
        (_spec("w-qd1", IOPattern.RANDWRITE, 1), DeviceConfig(scheduler=Scheduler.NONE)),
        (_spec("r-qd16", IOPattern.RANDREAD, 16), DeviceConfig(scheduler=Scheduler.NONE)),
        (_spec("r-qd1", IOPattern.RANDREAD, 1), DeviceConfig(scheduler=Scheduler.BFQ)),
    ]
    for spec, config in runs:
        measured = measure(spec, target, workdir=tmp_path)
        body = benchmark_observation(device.id, measured, config).model_dump(mode="json")
        assert (
            client.post("/api/v1/observations", json=body, headers=bearer(token)).status_code == 201
        )

    samples = load_samples(session)
    mine = [s for s in samples if s.device_id == device.id]
    assert [s.workload.name for s in mine] == ["r-qd1", "w-qd1", "r-qd16", "r-qd1"]
    assert all(s.value(Objective.P50) and s.value(Objective.IOPS) for s in mine)
    assert mine[3].config.scheduler is Scheduler.BFQ

    facts = dataset.facts_for(mine)[device.id]
    # the QD1 latency and asymmetry come from the plain runs only, not bfq's
    plain_read = mine[0].metrics["lat_mean_us"]
    assert facts.qd1_read_us == plain_read
    assert facts.write_over_read == mine[1].metrics["lat_mean_us"] / plain_read
    assert facts.parallel_speedup is not None
    assert facts.parallel_speedup > 0
    features = row(facts, mine[0].workload, mine[0].config)
    assert features["qd1_read_us"] == plain_read


def _grid_with_plain_runs(iops_by_depth: dict[int, float], qd1_us: float) -> Grid:
    """One device with plain (none, interrupt) 4 KiB random-read runs at the given depths."""
    grid = Grid()
    grid.devices["d"] = GridDevice(
        "d", {"device_class": "nvme_flash", "rotational": False}, (Scheduler.NONE,),
        DeviceConfig(scheduler=Scheduler.NONE), "synthetic",
    )  # fmt: skip
    for depth in sorted({1, *iops_by_depth}):
        name = f"read-qd{depth}"
        grid.workloads[name] = fio_workload(name, IOPattern.RANDREAD, depth)
        metrics = {"lat_mean_us": qd1_us, "iops": iops_by_depth.get(depth, 1e6 / qd1_us)}
        grid.add_run("d", name, DeviceConfig(scheduler=Scheduler.NONE), 0, metrics)
    return grid


def test_the_speedup_is_taken_at_one_depth_on_every_device() -> None:
    """Measured at QD16 and QD32, the feature is QD16's (it took the deepest, so one device's
    figure was at QD16 and another's at QD32); measured at QD32 only, it is interpolated on
    log-log axes from QD1 (speed-up 1) to QD32 — below QD32's, above QD1's."""
    both = _grid_with_plain_runs({16: 80_000.0, 32: 120_000.0}, qd1_us=100.0)
    facts = dataset.measured_facts(both.samples())[both.devices["d"].id]
    assert facts["parallel_speedup"] == pytest.approx(8.0)
    assert dataset.SPEEDUP_DEPTH == 16
    deep_only = _grid_with_plain_runs({32: 120_000.0}, qd1_us=100.0)
    facts = dataset.measured_facts(deep_only.samples())[deep_only.devices["d"].id]
    assert facts["parallel_speedup"] == pytest.approx(12.0 ** (4 / 5))
    assert dataset.speedup_at({8: 4.0}, 100.0) == 4.0  # shallower only: not extrapolated
    assert dataset.speedup_at({1: 1.0}, 100.0) is None


def test_a_held_out_device_keeps_its_probe_facts_after_a_canary() -> None:
    """After its first canary (no plain run) the held-out device's facts still carry what its
    probe measured: they came from the canaries alone, and lost QD1 latency and speed-up."""
    grid = _grid_with_plain_runs({16: 80_000.0}, qd1_us=100.0)
    device = grid.devices["d"]
    canary = dataset.Sample(
        device.id, device.row, grid.workloads["read-qd1"],
        DeviceConfig(scheduler=Scheduler.BFQ), {"lat_mean_us": 140.0, "iops": 7000.0},
        datetime.now(UTC),
    )  # fmt: skip
    before = evaluate.probe_facts(grid, "d")
    after = evaluate.held_out_facts(grid, "d", [canary])
    assert before.qd1_read_us == after.qd1_read_us == 100.0
    assert after.parallel_speedup == pytest.approx(8.0)
    assert dataset.facts_for([canary])[device.id].qd1_read_us is None  # what it was given
