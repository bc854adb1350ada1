from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.errors import Conflict
from service.tables import TelemetryBatchRow, TelemetryWindowRow


def claim_batch(session: Session, batch_id: uuid.UUID, node_id: uuid.UUID, windows: int) -> bool:
    """Record the batch id; False if it was recorded before (by this transaction or another).

    A concurrent insert of the same id waits on the primary key until the other commits.
    """
    claimed = session.scalar(
        pg_insert(TelemetryBatchRow)
        .values(batch_id=batch_id, node_id=node_id, windows=windows)
        .on_conflict_do_nothing(index_elements=[TelemetryBatchRow.batch_id])
        .returning(TelemetryBatchRow.batch_id)
    )
    return claimed is not None


def batch_owner(session: Session, batch_id: uuid.UUID) -> uuid.UUID | None:
    return session.scalar(
        select(TelemetryBatchRow.node_id).where(TelemetryBatchRow.batch_id == batch_id)
    )


def insert_windows(session: Session, rows: list[dict[str, Any]]) -> None:
    try:
        session.execute(insert(TelemetryWindowRow), rows)
    except IntegrityError as error:
        if "uq_telemetry_windows_device_id" in str(error.orig):
            raise Conflict(
                "a window for the same device and interval was ingested before in another batch"
            ) from error
        raise


def windows_for_device(
    session: Session,
    device_id: uuid.UUID,
    *,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> Sequence[TelemetryWindowRow]:
    query = (
        select(TelemetryWindowRow)
        .where(TelemetryWindowRow.device_id == device_id)
        .order_by(TelemetryWindowRow.window_start.desc())
        .limit(limit)
    )
    if since is not None:
        query = query.where(TelemetryWindowRow.window_start >= since)
    if until is not None:
        query = query.where(TelemetryWindowRow.window_end <= until)
    return session.scalars(query).all()


def busy_mean_latency(
    session: Session,
    device_id: uuid.UUID,
    *,
    starting_from: datetime,
    ending_by: datetime | None = None,
) -> tuple[float | None, int]:
    """The mean of a device's busy windows' mean latency (µs) in a span, and how many windows."""
    query = select(func.avg(TelemetryWindowRow.mean_latency_us), func.count()).where(
        TelemetryWindowRow.device_id == device_id,
        TelemetryWindowRow.window_start >= starting_from,
        TelemetryWindowRow.iops > 0,
    )
    if ending_by is not None:
        query = query.where(TelemetryWindowRow.window_end <= ending_by)
    mean, count = session.execute(query).one()
    return (float(mean) if mean is not None else None), int(count)
