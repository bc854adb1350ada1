"""Results as observations for the service."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from agent.bench.measure import Measurement
from agent.canary import CanaryResult
from agent.contract.tunables import DeviceConfig
from agent.contract.wire import ObservationCreate, ObservationKind
from agent.contract.workloads import WorkloadSpec


def benchmark_observation(
    device_id: uuid.UUID, measurement: Measurement, config: DeviceConfig
) -> ObservationCreate:
    return ObservationCreate(
        device_id=device_id,
        kind=ObservationKind.BENCHMARK,
        tool=measurement.workload.tool,
        workload=measurement.workload,
        configuration=config,
        metrics=measurement.metrics,
        started_at=measurement.started_at,
        finished_at=measurement.finished_at,
    )


def canary_observations(
    device_id: uuid.UUID,
    workload: WorkloadSpec,
    candidate: DeviceConfig,
    result: CanaryResult,
    statistics: dict[str, float] | None = None,
) -> tuple[ObservationCreate, ObservationCreate | None]:
    """The canary (the candidate's medians, the verdict and every statistic) and its baseline
    rounds as a benchmark of the configuration the device ran: every canary measures that
    as well, and the model learns both cells from it (None when what the baseline ran is
    not certain)."""
    finished = datetime.now(UTC)
    common = {
        "device_id": device_id,
        "tool": workload.tool,
        "workload": workload,
        "started_at": finished - timedelta(seconds=result.seconds),
        "finished_at": finished,
    }
    canary = ObservationCreate(
        **common,
        kind=ObservationKind.CANARY,
        configuration=candidate,
        metrics={s.metric: s.candidate_median for s in result.per_metric},
        verdict=result.verdict,
        statistics=statistics if statistics is not None else result.statistics(),
    )
    if result.baseline is None or not result.per_metric:
        return canary, None
    baseline = ObservationCreate(
        **common,
        kind=ObservationKind.BENCHMARK,
        configuration=result.baseline,
        metrics={s.metric: s.baseline_median for s in result.per_metric},
    )
    return canary, baseline
