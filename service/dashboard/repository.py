"""What the dashboard's pages read: the fleet with its policies, and one device's telemetry,
observations and recommendations, newest first."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from agent.contract.base import EARLIEST_WINDOW, MAX_CLOCK_SKEW
from service.devices import repository as devices_repository
from service.tables import (
    Device,
    Node,
    Observation,
    Policy,
    RecommendationRow,
    TelemetryHourlyRow,
    TelemetryWindowRow,
)


def present_devices(
    session: Session, *, after: tuple[str, str] | None = None, limit: int = 100
) -> list[tuple[Device, str, Policy | None]]:
    """A page of present devices with their node's hostname and policy, by host and name,
    after the (hostname, name) given: keyset pagination, as fast on the last page of a large
    fleet as on the first."""
    query = (
        select(Device, Node.hostname, Policy)
        .join(Node, Node.id == Device.node_id)
        .outerjoin(Policy, Policy.device_id == Device.id)
        .where(Device.present.is_(True))
        .order_by(Node.hostname, Device.name)
        .limit(limit)
    )
    if after is not None:
        query = query.where(tuple_(Node.hostname, Device.name) > tuple_(*after))
    return [(device, hostname, policy) for device, hostname, policy in session.execute(query)]


def fleet_counts(session: Session) -> dict[str, dict[str, int]]:
    """Present devices counted by class, current scheduler and completion mode, from the
    trigger-kept counts: counting the devices themselves took 130-180 ms on an idle machine at
    10,000 nodes x 16 devices, 377 ms p95 under the fleet's telemetry (`python -m
    bench.fleet`)."""
    found: dict[str, dict[str, int]] = {"classes": {}, "schedulers": {}, "completions": {}}
    for device_class, scheduler, completion, n in devices_repository.counts(session):
        for name, key in (
            ("classes", device_class),
            ("schedulers", scheduler),
            ("completions", completion),
        ):
            found[name][key] = found[name].get(key, 0) + n
    return {name: dict(sorted(each.items())) for name, each in found.items()}


def device_names(session: Session, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """host/device for these devices."""
    wanted = list(set(ids))
    if not wanted:
        return {}
    rows = session.execute(
        select(Device.id, Node.hostname, Device.name)
        .join(Node, Node.id == Device.node_id)
        .where(Device.id.in_(wanted))
    )
    return {device_id: f"{host}/{name}" for device_id, host, name in rows}


def device(session: Session, device_id: uuid.UUID) -> tuple[Device, Node, Policy | None] | None:
    found = session.get(Device, device_id)
    if found is None:
        return None
    node = session.get(Node, found.node_id)
    assert node is not None  # the foreign key
    policy = session.scalars(select(Policy).where(Policy.device_id == device_id)).one_or_none()
    return found, node, policy


def latest_windows(session: Session, device_id: uuid.UUID, limit: int) -> list[TelemetryWindowRow]:
    """The device's last `limit` telemetry windows, oldest first. Windows dated outside the
    plausible range (stored before the service refused them) are left out, so that they
    neither hide the real ones nor break a chart."""
    latest = datetime.now(UTC) + MAX_CLOCK_SKEW
    newest = session.scalars(
        select(TelemetryWindowRow)
        .where(TelemetryWindowRow.device_id == device_id)
        .where(TelemetryWindowRow.window_start >= EARLIEST_WINDOW)
        .where(TelemetryWindowRow.window_end <= latest)
        .order_by(TelemetryWindowRow.window_start.desc())
        .limit(limit)
    ).all()
    return list(reversed(newest))


def latest_observations(session: Session, device_id: uuid.UUID, limit: int) -> list[Observation]:
    return list(
        session.scalars(
            select(Observation)
            .where(Observation.device_id == device_id)
            .order_by(Observation.finished_at.desc())
            .limit(limit)
        ).all()
    )


def latest_recommendations(
    session: Session, device_id: uuid.UUID, limit: int
) -> Sequence[RecommendationRow]:
    return session.scalars(
        select(RecommendationRow)
        .where(RecommendationRow.device_id == device_id)
        .order_by(RecommendationRow.created_at.desc())
        .limit(limit)
    ).all()


def hours(session: Session, device_id: uuid.UUID, since: datetime) -> list[TelemetryHourlyRow]:
    """The device's hourly rollups since then, oldest first."""
    return list(
        session.scalars(
            select(TelemetryHourlyRow)
            .where(TelemetryHourlyRow.device_id == device_id, TelemetryHourlyRow.hour >= since)
            .order_by(TelemetryHourlyRow.hour)
        )
    )
