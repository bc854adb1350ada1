from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from service.tables import Device


def get(session: Session, device_id: uuid.UUID) -> Device | None:
    return session.get(Device, device_id)


def for_node(session: Session, node_id: uuid.UUID) -> Sequence[Device]:
    return session.scalars(
        select(Device).where(Device.node_id == node_id).order_by(Device.name)
    ).all()


def ids_by_name(session: Session, node_id: uuid.UUID) -> dict[str, uuid.UUID]:
    """Every device the node has ever reported, present or not."""
    rows = session.execute(select(Device.name, Device.id).where(Device.node_id == node_id))
    return {name: device_id for name, device_id in rows}


def list_devices(
    session: Session,
    *,
    node_id: uuid.UUID | None,
    device_class: str | None,
    present: bool | None,
    limit: int,
    offset: int,
    after: tuple[uuid.UUID, str] | None = None,
) -> Sequence[Device]:
    """By node and name (the unique index), after the (node id, name) given if any."""
    query = select(Device).order_by(Device.node_id, Device.name).limit(limit).offset(offset)
    if after is not None:
        query = query.where(tuple_(Device.node_id, Device.name) > tuple_(*after))
    if node_id is not None:
        query = query.where(Device.node_id == node_id)
    if device_class is not None:
        query = query.where(Device.device_class == device_class)
    if present is not None:
        query = query.where(Device.present.is_(present))
    return session.scalars(query).all()


def add(session: Session, device: Device, *, flush: bool = True) -> Device:
    session.add(device)
    if flush:
        session.flush()
    return device
