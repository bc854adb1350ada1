from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from agent.contract.tunables import DeviceConfig
from agent.contract.wire import CanaryVerdict, ObservationKind
from agent.contract.workloads import WorkloadSpec


class ObservationRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    device_id: uuid.UUID
    kind: ObservationKind
    tool: str
    workload: WorkloadSpec
    configuration: DeviceConfig
    metrics: dict[str, float]
    statistics: dict[str, float]
    verdict: CanaryVerdict | None
    started_at: datetime
    finished_at: datetime
    recorded_by: str
    created_at: datetime
