"""One measured run of a workload on a target: fio or db_bench, with energy, and with the
FIOS fairness metrics when several tasks share the device."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from agent.bench import dbbench, fio
from agent.bench.energy import EnergyMeter, energy_metrics
from agent.bench.fairness import Alone, fairness
from agent.bench.target import BenchTarget, check_allowed
from agent.contract.workloads import WorkloadSpec
from agent.effects import Effects


@dataclass(frozen=True)
class Measurement:
    workload: WorkloadSpec
    metrics: dict[str, float]
    started_at: datetime
    finished_at: datetime
    tasks: list[fio.TaskResult]
    # each job's single task run by itself, where fairness was measured (by job name)
    alone: dict[str, Alone] = field(default_factory=dict)


def measure(
    workload: WorkloadSpec,
    target: BenchTarget,
    *,
    workdir: Path,
    meter: EnergyMeter | None = None,
    effects: Effects | None = None,
    with_fairness: bool = True,
) -> Measurement:
    check_allowed(target, workload)
    alone: dict[str, Alone] = {}
    if with_fairness and workload.tool == "fio" and workload.tasks > 1:
        for job in workload.jobs:
            single = workload.model_copy(
                update={
                    "name": f"{workload.name}-alone-{job.name}",
                    "jobs": [job.model_copy(update={"tasks": 1})],
                }
            )
            (task,) = fio.run(single, target, effects=effects, workdir=workdir).tasks
            alone[job.name] = Alone(task.mean_latency_us, task.iops)
    started = datetime.now(UTC)
    if meter:
        meter.start()
    tasks: list[fio.TaskResult] = []
    if workload.tool == "db_bench":
        assert workload.db_bench is not None
        metrics = dbbench.run(workload.db_bench, target, workload.duration_s, effects)
    else:
        result = fio.run(workload, target, effects=effects, workdir=workdir)
        metrics, tasks = dict(result.metrics), result.tasks
    energy = meter.stop() if meter else None
    finished = datetime.now(UTC)
    metrics.update(energy_metrics(energy, metrics["ios"], metrics["io_bytes"]))
    if alone:
        metrics.update(fairness(tasks, alone))
    return Measurement(workload, metrics, started, finished, tasks, alone)
