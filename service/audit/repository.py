from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json
from sqlalchemy import select, text
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


# events from one JSON document: one statement and one parameter for any number of them
_INSERT_EVENTS = text(
    "INSERT INTO audit_events (actor, action, target_type, target_id, before, after, detail)"
    " SELECT actor, action, target_type, target_id, before, after, detail"
    " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS e(actor text, action text,"
    " target_type text, target_id text, before jsonb, after jsonb, detail text)"
)


def add_many(session: Session, rows: list[dict[str, Any]]) -> None:
    """Events as rows (actor, action, target_type, target_id, before, after, detail), in one
    INSERT from one JSON parameter, without RETURNING (their ids and times are the
    database's): for many events at once, nothing read back."""
    if rows:
        session.execute(_INSERT_EVENTS, {"rows": to_json(rows).decode()})


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
