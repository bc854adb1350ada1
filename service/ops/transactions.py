"""Run callbacks only once the request's transaction has committed (metrics, notifications)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.orm import Session

_KEY = "blkpilot_on_commit"


def on_commit(session: Session, callback: Callable[[], None]) -> None:
    session.info.setdefault(_KEY, []).append(callback)


@event.listens_for(Session, "after_commit")
def _run_after_commit(session: Session) -> None:
    for callback in session.info.pop(_KEY, []):
        callback()


@event.listens_for(Session, "after_soft_rollback")
def _drop_after_rollback(session: Session, previous_transaction: object) -> None:
    session.info.pop(_KEY, None)
