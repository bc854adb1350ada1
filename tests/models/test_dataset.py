"""Training samples from real observations: fio runs on a real loop device, recorded through
the API into PostgreSQL, read back with the device's measured facts."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from agent.bench.measure import measure
from agent.bench.report import benchmark_observation
from agent.bench.target import device_target
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.workloads import IOEngine, IOPattern, JobSpec, WorkloadSpec
from agent.host import HostPaths
from models import dataset
from models.features import row
from models.priors import Objective
from service.recommendations.nightly import load_samples
from tests.agent.conftest import LoopFactory
from tests.factories import bearer, create_node, device_inventory, report_inventory


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
