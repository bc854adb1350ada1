from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.tables import Device, Policy


def for_device(session: Session, device_id: uuid.UUID, *, lock: bool = False) -> Policy | None:
    query = select(Policy).where(Policy.device_id == device_id)
    if lock:
        query = query.with_for_update()
    return session.scalar(query)


def for_node(session: Session, node_id: uuid.UUID) -> Sequence[tuple[Policy, Device]]:
    rows = session.execute(
        select(Policy, Device)
        .join(Device, Device.id == Policy.device_id)
        .where(Device.node_id == node_id)
        .order_by(Device.name)
    )
    return [(policy, device) for policy, device in rows]


def add(session: Session, policy: Policy) -> Policy:
    session.add(policy)
    session.flush()
    session.refresh(policy)
    return policy


def delete(session: Session, policy: Policy) -> None:
    session.delete(policy)
    session.flush()


def save(session: Session, policy: Policy, *, touched: bool = False) -> Policy:
    """Flushes the policy's changes; `touched` stamps it with the database's time."""
    if touched:
        policy.updated_at = func.now()
    session.flush()
    session.refresh(policy)
    return policy
