from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json
from sqlalchemy import Connection, func, select, text, tuple_
from sqlalchemy.orm import Session

from service.tables import DEVICE_COUNTS, Device


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


# new devices from one JSON document: one statement and one parameter for any number of rows,
# where executemany sends a statement per row (psycopg 3 pipelines them, each executed and
# each bound in Python) — every column is given, in the table's order
_INSERT_DEVICES = text(
    "INSERT INTO devices SELECT * FROM"
    " jsonb_populate_recordset(CAST(NULL AS devices), CAST(:rows AS jsonb))"
)


def add_many(session: Session, rows: list[dict[str, Any]]) -> None:
    """New devices as rows, every column given (their ids too): one INSERT from one JSON
    parameter, with no ORM objects made and refreshed for them (RETURNING and a sentinel per
    row: 16 new devices and their audit events took 3 ms of a node's enrolment to flush)."""
    missing = set(Device.__table__.columns.keys()) - set(rows[0]) if rows else set()
    if missing:
        raise ValueError(f"new device rows lack {', '.join(sorted(missing))}")
    if rows:
        session.execute(_INSERT_DEVICES, {"rows": to_json(rows).decode()})


def counts(session: Session) -> list[tuple[str, str, str, int]]:
    """Present devices by (class, current scheduler or "unknown", completion mode in force):
    the sums of the trigger-kept device_counts (migration 0009), no scan of the devices."""
    n = func.sum(DEVICE_COUNTS.c.n)
    keys = (DEVICE_COUNTS.c.device_class, DEVICE_COUNTS.c.scheduler, DEVICE_COUNTS.c.completion)
    rows = session.execute(select(*keys, n).group_by(*keys).having(n != 0))
    return [(a, b, c, int(total)) for a, b, c, total in rows]


def fold_counts(connection: Connection) -> int:
    """Folds device_counts' +1/-1 rows into one row per key; returns the rows removed. Rows
    that concurrent transactions have not committed yet are not seen and stay; two replicas
    folding at once take turns on the rows (a deleted row is not returned twice)."""
    before = connection.execute(text("SELECT count(*) FROM device_counts")).scalar_one()
    after = connection.execute(
        text(
            "WITH gone AS (DELETE FROM device_counts RETURNING *)"
            " INSERT INTO device_counts"
            " SELECT device_class, scheduler, completion, sum(n) FROM gone"
            " GROUP BY 1, 2, 3 HAVING sum(n) <> 0"
        )
    ).rowcount
    return int(before) - int(after)
