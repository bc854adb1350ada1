"""What the dashboard's pages read: the fleet with its policies, and one device's telemetry,
observations and recommendations, newest first."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.contract.base import EARLIEST_WINDOW, MAX_CLOCK_SKEW
from service.tables import Device, Node, Observation, Policy, RecommendationRow, TelemetryWindowRow


def present_devices(session: Session) -> list[tuple[Device, str, Policy | None]]:
    """Every present device with its node's hostname and its policy, by host and name."""
    rows = session.execute(
        select(Device, Node.hostname, Policy)
        .join(Node, Node.id == Device.node_id)
        .outerjoin(Policy, Policy.device_id == Device.id)
        .where(Device.present.is_(True))
        .order_by(Node.hostname, Device.name)
    )
    return [(device, hostname, policy) for device, hostname, policy in rows]


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
