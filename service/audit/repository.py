from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from service.tables import AuditEvent


def add(
    session: Session,
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    detail: str,
    flush: bool = True,
) -> AuditEvent:
    event = AuditEvent(
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        before=before,
        after=after,
        detail=detail,
    )
    session.add(event)
    if flush:
        session.flush()
    return event


def add_many(session: Session, rows: list[dict[str, Any]]) -> None:
    """Events as rows, in one multi-row INSERT without RETURNING (their ids and times are the
    database's): for many events at once, nothing read back."""
    if rows:
        session.execute(insert(cast(Table, AuditEvent.__table__)), rows)


def list_events(
    session: Session,
    *,
    target_type: str | None,
    target_id: str | None,
    action: str | None,
    actor: str | None,
    before_id: int | None,
    limit: int,
) -> Sequence[AuditEvent]:
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if target_type is not None:
        query = query.where(AuditEvent.target_type == target_type)
    if target_id is not None:
        query = query.where(AuditEvent.target_id == target_id)
    if action is not None:
        query = query.where(AuditEvent.action == action)
    if actor is not None:
        query = query.where(AuditEvent.actor == actor)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    return session.scalars(query).all()
