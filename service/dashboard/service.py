"""What the dashboard's pages show, read through the repository: the fleet, and one device
with its telemetry, observations and recommendations."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from service.dashboard import repository
from service.tables import (
    Device,
    Node,
    Observation,
    Policy,
    RecommendationRow,
    TelemetryHourlyRow,
    TelemetryWindowRow,
)

WINDOWS_SHOWN = 720  # an hour of 5 s windows
OBSERVATIONS_READ = 5000
RECOMMENDATIONS_SHOWN = 10
HOURS_SHOWN = timedelta(days=90)  # hourly rollups outlive the raw windows


@dataclass(frozen=True)
class DeviceDetail:
    device: Device
    node: Node
    policy: Policy | None
    windows: list[TelemetryWindowRow]  # oldest first
    observations: list[Observation]  # newest first
    recommendations: Sequence[RecommendationRow]  # newest first
    hours: list[TelemetryHourlyRow]  # oldest first: the rollups of the last HOURS_SHOWN


FLEET_PAGE = 100


@dataclass(frozen=True)
class FleetPage:
    counts: dict[str, dict[str, int]]  # classes, schedulers, completions -> value -> devices
    devices: list[tuple[Device, str, Policy | None]]  # this page, by host and name
    next_after: tuple[str, str] | None  # (hostname, name) the next page starts after


def fleet(session: Session, *, after: tuple[str, str] | None = None) -> FleetPage:
    """The fleet's counts, and a page of present devices with host names and policies."""
    rows = repository.present_devices(session, after=after, limit=FLEET_PAGE + 1)
    more = len(rows) > FLEET_PAGE
    rows = rows[:FLEET_PAGE]
    last = (rows[-1][1], rows[-1][0].name) if more and rows else None
    return FleetPage(repository.fleet_counts(session), rows, last)


def device_names(session: Session, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    return repository.device_names(session, ids)


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
        repository.hours(session, device_id, datetime.now(UTC) - HOURS_SHOWN),
    )
