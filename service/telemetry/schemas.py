from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict


class TelemetryWindowRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    device_id: uuid.UUID
    batch_id: uuid.UUID
    window_start: datetime
    window_end: datetime
    read_ios: int
    write_ios: int
    read_bytes: int
    write_bytes: int
    iops: float
    read_share: float
    mean_request_bytes: float
    mean_latency_us: float
    queue_depth: float
    utilisation: float
    power_watts: float | None
    energy_joules: float | None
    power_scope: str | None
