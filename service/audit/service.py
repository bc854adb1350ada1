"""Every change to a policy or to a device's configuration is recorded here, in the same
transaction as the change itself: no change without its audit entry, and no entry without it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from service.audit import repository
from service.security import Principal
from service.tables import AuditEvent


def record(
    session: Session,
    actor: Principal | str,
    action: str,
    *,
    target_type: str,
    target_id: object,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    detail: str = "",
    flush: bool = True,
) -> AuditEvent:
    """An event in the session's transaction. flush=False leaves it to the next flush (one
    multi-row INSERT for many events: an inventory of 16 new devices)."""
    return repository.add(
        session,
        actor=actor if isinstance(actor, str) else actor.name,
        action=action,
        target_type=target_type,
        target_id=str(target_id),
        before=before,
        after=after,
        detail=detail,
        flush=flush,
    )


def record_many(
    session: Session, actor: Principal | str, action: str, events: list[dict[str, Any]]
) -> None:
    """Events of one action by one actor (each a target_type, target_id, and optionally
    before, after and detail) in the session's transaction, in one INSERT: an inventory of
    16 new devices."""
    name = actor if isinstance(actor, str) else actor.name
    repository.add_many(
        session,
        [
            {
                "actor": name,
                "action": action,
                "target_type": e["target_type"],
                "target_id": str(e["target_id"]),
                "before": e.get("before"),
                "after": e.get("after"),
                "detail": e.get("detail", ""),
            }
            for e in events
        ],
    )


def list_events(
    session: Session,
    *,
    target_type: str | None = None,
    target_id: str | None = None,
    action: str | None = None,
    actor: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> Sequence[AuditEvent]:
    return repository.list_events(
        session,
        target_type=target_type,
        target_id=target_id,
        action=action,
        actor=actor,
        before_id=before_id,
        limit=limit,
    )
