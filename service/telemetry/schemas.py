from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field


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
    cpu_utilisation: float | None
    context_switches_per_s: float | None
    power_watts: float | None
    energy_joules: float | None
    power_scope: str | None
    power_source: str | None
    power_readings: list[dict[str, Any]] | None
    latency_source: str
    latency_note: str
    operations: list[dict[str, Any]] | None
    p50_us: float | None
    p99_us: float | None
    p999_us: float | None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def bytes_per_joule(self) -> float | None:
        """The device's bytes over the node's energy in the window (the papers' metric)."""
        if not self.energy_joules:
            return None
        return (self.read_bytes + self.write_bytes) / self.energy_joules


class TelemetryHourRead(BaseModel):
    """A device's hour, rolled up from its raw windows (kept past the raw retention)."""

    model_config = ConfigDict(from_attributes=True)

    device_id: uuid.UUID
    hour: datetime
    windows: int
    seconds: float
    read_ios: int
    write_ios: int
    read_bytes: int
    write_bytes: int
    queue_depth_seconds: float
    busy_seconds: float
    latency_us_ios: float
    energy_joules: float | None
    max_p99_us: float | None
    operations: list[dict[str, Any]] | None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def iops(self) -> float:
        return (self.read_ios + self.write_ios) / self.seconds if self.seconds else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mean_latency_us(self) -> float | None:
        ios = self.read_ios + self.write_ios
        return self.latency_us_ios / ios if ios else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def utilisation(self) -> float:
        return self.busy_seconds / self.seconds if self.seconds else 0.0
