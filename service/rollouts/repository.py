from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from service.tables import Device, Node, Rollout, RolloutTarget

ACTIVE = ("running", "paused", "rolling_back")


def get(session: Session, rollout_id: uuid.UUID, *, lock: bool = False) -> Rollout | None:
    query = select(Rollout).where(Rollout.id == rollout_id)
    return session.scalars(query.with_for_update() if lock else query).one_or_none()


def list_rollouts(
    session: Session, *, status: str | None, limit: int, offset: int
) -> Sequence[Rollout]:
    query = select(Rollout).order_by(Rollout.created_at.desc()).limit(limit).offset(offset)
    if status is not None:
        query = query.where(Rollout.status == status)
    return session.scalars(query).all()


def targets(session: Session, rollout_id: uuid.UUID) -> Sequence[RolloutTarget]:
    query = (
        select(RolloutTarget)
        .where(RolloutTarget.rollout_id == rollout_id)
        .order_by(RolloutTarget.stage, RolloutTarget.hostname, RolloutTarget.device_name)
    )
    return session.scalars(query).all()


def devices_with_nodes(
    session: Session,
    *,
    device_class: str | None,
    node_labels: dict[str, str],
    device_ids: list[uuid.UUID],
) -> Sequence[tuple[Device, Node]]:
    query = select(Device, Node).join(Node, Device.node_id == Node.id)
    if device_class is not None:
        query = query.where(Device.device_class == device_class)
    if node_labels:
        query = query.where(Node.labels.contains(node_labels))
    if device_ids:
        query = query.where(Device.id.in_(device_ids))
    return [
        (device, node)
        for device, node in session.execute(query.order_by(Node.hostname, Device.name))
    ]


def known_device_ids(session: Session, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    return set(session.scalars(select(Device.id).where(Device.id.in_(ids))).all())


def hostnames_in_use(session: Session, hostnames: set[str]) -> dict[str, int]:
    """How many nodes carry each of these hostnames (a rollout addresses nodes by name)."""
    counts: dict[str, int] = {}
    for name in session.scalars(select(Node.hostname).where(Node.hostname.in_(hostnames))):
        counts[name] = counts.get(name, 0) + 1
    return counts


def busy_devices(session: Session, device_ids: list[uuid.UUID]) -> Sequence[tuple[str, str]]:
    """(device name, rollout name) for devices already in an unfinished rollout."""
    query = (
        select(RolloutTarget.device_name, Rollout.name)
        .join(Rollout, Rollout.id == RolloutTarget.rollout_id)
        .where(RolloutTarget.device_id.in_(device_ids), Rollout.status.in_(ACTIVE))
    )
    return [(str(name), str(rollout)) for name, rollout in session.execute(query).all()]


def claim(session: Session, owner: str, now: datetime, until: datetime) -> uuid.UUID | None:
    """Take the lease on the oldest rollout with work to do that no live worker holds."""
    query = (
        select(Rollout)
        .where(
            Rollout.status.in_(("running", "rolling_back")),
            or_(
                Rollout.lease_owner.is_(None),
                Rollout.lease_owner == owner,
                Rollout.lease_until < now,
            ),
        )
        .order_by(Rollout.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    rollout = session.scalars(query).one_or_none()
    if rollout is None:
        return None
    rollout.lease_owner, rollout.lease_until = owner, until
    return rollout.id


def extend_lease(session: Session, rollout_id: uuid.UUID, owner: str, until: datetime) -> str:
    """Extend this worker's lease; returns the rollout's status ('' if the lease was lost)."""
    row = session.execute(
        update(Rollout)
        .where(Rollout.id == rollout_id, Rollout.lease_owner == owner)
        .values(lease_until=until)
        .returning(Rollout.status)
    ).one_or_none()
    return row[0] if row else ""


def release(session: Session, owner: str) -> None:
    session.execute(
        update(Rollout)
        .where(Rollout.lease_owner == owner)
        .values(lease_owner=None, lease_until=None)
    )
