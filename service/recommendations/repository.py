"""Recommendations, model versions and scheduled canaries in PostgreSQL, and what the nightly
job reads to make them: every observation with its device, present devices with their
policies, and recent telemetry."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.tables import (
    Device,
    ModelVersion,
    NightlyRun,
    Observation,
    Policy,
    RecommendationRow,
    ScheduledCanary,
    TelemetryWindowRow,
)
from service.telemetry import repository as telemetry_repository

# what workload mapping reads from a telemetry window
WINDOW_SHAPE = (
    TelemetryWindowRow.iops,
    TelemetryWindowRow.read_ios,
    TelemetryWindowRow.write_ios,
    TelemetryWindowRow.read_share,
    TelemetryWindowRow.mean_request_bytes,
    TelemetryWindowRow.queue_depth,
    TelemetryWindowRow.operations,
)


# --- recommendations --------------------------------------------------------------------------


def list_recommendations(
    session: Session,
    *,
    device_id: uuid.UUID | None,
    status: str | None,
    objective: str | None,
    limit: int,
    offset: int,
) -> Sequence[RecommendationRow]:
    query = select(RecommendationRow)
    if device_id is not None:
        query = query.where(RecommendationRow.device_id == device_id)
    if status is not None:
        query = query.where(RecommendationRow.status == status)
    if objective is not None:
        query = query.where(RecommendationRow.objectives.contains([objective]))
    query = query.order_by(RecommendationRow.created_at.desc(), RecommendationRow.id)
    return session.scalars(query.limit(limit).offset(offset)).all()


def get(
    session: Session, recommendation_id: uuid.UUID, *, lock: bool = False
) -> RecommendationRow | None:
    query = select(RecommendationRow).where(RecommendationRow.id == recommendation_id)
    return session.scalars(query.with_for_update() if lock else query).one_or_none()


def latest_for_device(
    session: Session, device_id: uuid.UUID, *, limit: int
) -> Sequence[RecommendationRow]:
    query = (
        select(RecommendationRow)
        .where(RecommendationRow.device_id == device_id)
        .order_by(RecommendationRow.created_at.desc())
        .limit(limit)
    )
    return session.scalars(query).all()


def proposals(session: Session, device_id: uuid.UUID) -> Sequence[RecommendationRow]:
    """The device's open recommendations, newest first (read only)."""
    query = (
        select(RecommendationRow)
        .where(RecommendationRow.device_id == device_id, RecommendationRow.status == "proposed")
        .order_by(RecommendationRow.created_at.desc())
    )
    return session.scalars(query).all()


def open_for_device(session: Session, device_id: uuid.UUID) -> Sequence[RecommendationRow]:
    """The device's proposed recommendations and the ones being verified by their rollout."""
    query = select(RecommendationRow).where(
        RecommendationRow.device_id == device_id,
        RecommendationRow.status.in_(("proposed", "verifying")),
    )
    return session.scalars(query.with_for_update()).all()


def following(session: Session, rollout_id: uuid.UUID) -> Sequence[RecommendationRow]:
    """The recommendations whose standing follows this rollout: verifying, or kept by it."""
    query = select(RecommendationRow).where(
        RecommendationRow.rollout_id == rollout_id,
        RecommendationRow.status.in_(("verifying", "kept")),
    )
    return session.scalars(query.with_for_update()).all()


def supersede_proposals(
    session: Session,
    device_id: uuid.UUID,
    *,
    objectives: Sequence[str] | None = None,
    keep: uuid.UUID | None = None,
) -> list[uuid.UUID]:
    """The device's open proposals (for any of these objectives, or all but `keep`) are
    superseded; returns their ids."""
    query = update(RecommendationRow).where(
        RecommendationRow.device_id == device_id, RecommendationRow.status == "proposed"
    )
    if objectives is not None:
        query = query.where(RecommendationRow.objectives.overlap(list(objectives)))
    if keep is not None:
        query = query.where(RecommendationRow.id != keep)
    return list(session.scalars(query.values(status="superseded").returning(RecommendationRow.id)))


def add(
    session: Session, row: RecommendationRow | ModelVersion | ScheduledCanary | NightlyRun
) -> None:
    session.add(row)


def flush(session: Session) -> None:
    session.flush()


def counts_by_status(session: Session) -> dict[str, int]:
    query = select(RecommendationRow.status, func.count()).group_by(RecommendationRow.status)
    return {status: count for status, count in session.execute(query)}


# --- model versions ---------------------------------------------------------------------------


def model_versions(
    session: Session, *, run_id: uuid.UUID | None, limit: int, offset: int
) -> Sequence[ModelVersion]:
    query = select(ModelVersion)
    if run_id is not None:
        query = query.where(ModelVersion.run_id == run_id)
    query = query.order_by(
        ModelVersion.created_at.desc(), ModelVersion.device_class, ModelVersion.objective
    )
    return session.scalars(query.limit(limit).offset(offset)).all()


# --- scheduled canaries -----------------------------------------------------------------------


def scheduled_canaries(
    session: Session, *, device_id: uuid.UUID | None, status: str | None, limit: int, offset: int
) -> Sequence[ScheduledCanary]:
    query = select(ScheduledCanary)
    if device_id is not None:
        query = query.where(ScheduledCanary.device_id == device_id)
    if status is not None:
        query = query.where(ScheduledCanary.status == status)
    query = query.order_by(ScheduledCanary.created_at.desc(), ScheduledCanary.rank)
    return session.scalars(query.limit(limit).offset(offset)).all()


def canaries_for_node(session: Session, node_id: uuid.UUID) -> Sequence[ScheduledCanary]:
    query = (
        select(ScheduledCanary)
        .join(Device, Device.id == ScheduledCanary.device_id)
        .where(Device.node_id == node_id, ScheduledCanary.status == "scheduled")
        .order_by(ScheduledCanary.rank, ScheduledCanary.created_at)
    )
    return session.scalars(query).all()


def scheduled_canary(session: Session, canary_id: uuid.UUID) -> ScheduledCanary | None:
    """Locked for the caller's update."""
    query = select(ScheduledCanary).where(ScheduledCanary.id == canary_id).with_for_update()
    return session.scalars(query).one_or_none()


def cancel_scheduled_canaries(session: Session) -> None:
    session.execute(
        update(ScheduledCanary)
        .where(ScheduledCanary.status == "scheduled")
        .values(status="cancelled")
    )


def device(session: Session, device_id: uuid.UUID) -> Device | None:
    return session.get(Device, device_id)


def observation(session: Session, observation_id: uuid.UUID) -> Observation | None:
    return session.get(Observation, observation_id)


# --- nightly runs queued through the API -----------------------------------------------------


def nightly_run(session: Session, run_id: uuid.UUID) -> NightlyRun | None:
    return session.get(NightlyRun, run_id)


def nightly_runs(session: Session, *, limit: int, offset: int) -> Sequence[NightlyRun]:
    query = select(NightlyRun).order_by(NightlyRun.created_at.desc(), NightlyRun.id)
    return session.scalars(query.limit(limit).offset(offset)).all()


def nightly_run_open(session: Session) -> NightlyRun | None:
    """The run queued or running, if there is one (one at a time: each retrains every model)."""
    query = select(NightlyRun).where(NightlyRun.status.in_(("queued", "running")))
    return session.scalars(query.limit(1)).first()


def claim_nightly_run(session: Session, now: datetime) -> NightlyRun | None:
    """The oldest queued run, marked running; skipped by another replica that claims at once."""
    query = (
        select(NightlyRun)
        .where(NightlyRun.status == "queued")
        .order_by(NightlyRun.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    found = session.scalars(query).first()
    if found is not None:
        found.status, found.started_at = "running", now
        session.flush()
    return found


def abandon_running_nightly_runs(session: Session, now: datetime, why: str) -> int:
    """Runs left running by a service that stopped mid-run: failed, with why."""
    done = session.execute(
        update(NightlyRun)
        .where(NightlyRun.status == "running")
        .values(status="failed", error=why, finished_at=now)
    )
    return int(done.rowcount or 0)  # type: ignore[attr-defined]


# --- what the nightly job reads ---------------------------------------------------------------


def observations_with_devices(
    session: Session, *, since: datetime | None = None, until: datetime | None = None
) -> Iterator[tuple[Observation, Device]]:
    """Every observation (of present and past devices) in the time range, oldest first."""
    query = select(Observation, Device).join(Device, Device.id == Observation.device_id)
    if since is not None:
        query = query.where(Observation.finished_at >= since)
    if until is not None:
        query = query.where(Observation.finished_at < until)
    rows = session.execute(query.order_by(Observation.finished_at))
    yield from ((observation_row, device_row) for observation_row, device_row in rows)


def canary_verdicts(
    session: Session, device_id: uuid.UUID, since: datetime
) -> list[tuple[dict[str, Any], str]]:
    """The device's canaries since then with a verdict, oldest first: (configuration,
    verdict)."""
    rows = session.execute(
        select(Observation.configuration, Observation.verdict)
        .where(
            Observation.device_id == device_id,
            Observation.kind == "canary",
            Observation.verdict.is_not(None),
            Observation.finished_at >= since,
        )
        .order_by(Observation.finished_at)
    )
    return [(configuration, str(verdict)) for configuration, verdict in rows]


def present_devices_with_policies(session: Session) -> list[tuple[Device, Policy | None]]:
    policies = {p.device_id: p for p in session.scalars(select(Policy))}
    devices = session.scalars(select(Device).where(Device.present.is_(True)))
    return [(d, policies.get(d.id)) for d in devices]


def window_shapes(session: Session, device_id: uuid.UUID, since: datetime) -> list[dict[str, Any]]:
    """The device's telemetry since then, as workload mapping reads it: raw windows where they
    are kept, hourly rollups before (past the raw retention)."""
    rows = session.execute(
        select(*WINDOW_SHAPE).where(
            TelemetryWindowRow.device_id == device_id, TelemetryWindowRow.window_end >= since
        )
    ).mappings()
    shapes = [dict(r) for r in rows]
    horizon = telemetry_repository.raw_horizon(session)
    if horizon is not None and since < horizon:
        hours = telemetry_repository.hourly_for_device(
            session, device_id, since=since, until=horizon
        )
        shapes = [telemetry_repository.hour_as_window(h) for h in hours] + shapes
    return shapes
