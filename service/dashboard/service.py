"""What the dashboard's pages show, read through the repository: the fleet, and one device
with its telemetry, observations and recommendations."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.dashboard import repository
from service.tables import Device, Node, Observation, Policy, RecommendationRow, TelemetryWindowRow

WINDOWS_SHOWN = 720  # an hour of 5 s windows
OBSERVATIONS_READ = 5000
RECOMMENDATIONS_SHOWN = 10


@dataclass(frozen=True)
class DeviceDetail:
    device: Device
    node: Node
    policy: Policy | None
    windows: list[TelemetryWindowRow]  # oldest first
    observations: list[Observation]  # newest first
    recommendations: Sequence[RecommendationRow]  # newest first


def fleet(session: Session) -> list[tuple[Device, str, Policy | None]]:
    """Present devices with their host's name and policy."""
    return repository.present_devices(session)


def device_detail(session: Session, device_id: uuid.UUID) -> DeviceDetail | None:
    found = repository.device(session, device_id)
    if found is None:
        return None
    device, node, policy = found
    return DeviceDetail(
        device,
        node,
        policy,
        repository.latest_windows(session, device_id, WINDOWS_SHOWN),
        repository.latest_observations(session, device_id, OBSERVATIONS_READ),
        repository.latest_recommendations(session, device_id, RECOMMENDATIONS_SHOWN),
    )
