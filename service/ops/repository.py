"""What the control plane's own metrics and readiness probe read: fleet counts from what is
stored (so they survive restarts), and whether the database answers."""

from __future__ import annotations

from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from service.devices import repository as devices_repository
from service.tables import (
    AuditEvent,
    Observation,
    RecommendationRow,
    Rollout,
    RolloutTarget,
)

ACTIVE_ROLLOUT = ("running", "paused", "rolling_back")
POLICY_ACTIONS = ("policy.set", "policy.cleared")


def ping(engine: Engine) -> None:
    """Raises if the database does not answer."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def devices_by_class_and_scheduler(session: Session) -> list[tuple[str, str, int]]:
    """From the trigger-kept counts: a scrape does not scan the fleet's devices."""
    totals: dict[tuple[str, str], int] = {}
    for device_class, scheduler, _completion, n in devices_repository.counts(session):
        totals[device_class, scheduler] = totals.get((device_class, scheduler), 0) + n
    return [(a, b, n) for (a, b), n in sorted(totals.items())]


def recommendations_by_status(session: Session) -> list[tuple[str, int]]:
    query = select(RecommendationRow.status, func.count()).group_by(RecommendationRow.status)
    return [(a, b) for a, b in session.execute(query)]


def rollouts_by_status(session: Session) -> list[tuple[str, int]]:
    query = select(Rollout.status, func.count()).group_by(Rollout.status)
    return [(a, b) for a, b in session.execute(query)]


def active_rollout_targets(session: Session) -> list[tuple[str, str, int]]:
    """Unfinished rollouts' devices by status."""
    query = (
        select(Rollout.name, RolloutTarget.status, func.count())
        .join(RolloutTarget, RolloutTarget.rollout_id == Rollout.id)
        .where(Rollout.status.in_(ACTIVE_ROLLOUT))
        .group_by(Rollout.name, RolloutTarget.status)
    )
    return [(a, b, c) for a, b, c in session.execute(query)]


def active_rollout_stages(session: Session) -> list[tuple[str, int]]:
    """Unfinished rollouts' current stage (0-based)."""
    query = select(Rollout.name, Rollout.stage).where(Rollout.status.in_(ACTIVE_ROLLOUT))
    return [(a, b) for a, b in session.execute(query)]


def canary_verdicts(session: Session) -> list[tuple[str | None, int]]:
    query = (
        select(Observation.verdict, func.count())
        .where(Observation.kind == "canary")
        .group_by(Observation.verdict)
    )
    return [(a, b) for a, b in session.execute(query)]


def policy_changes(session: Session) -> list[tuple[str, int]]:
    query = (
        select(AuditEvent.action, func.count())
        .where(AuditEvent.action.in_(POLICY_ACTIONS))
        .group_by(AuditEvent.action)
    )
    return [(a, b) for a, b in session.execute(query)]
