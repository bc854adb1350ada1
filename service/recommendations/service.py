"""Recommendations from the nightly job: listed, read, and decided by an operator. Accepting
one makes its configuration the device's policy (checked against what the device can take,
audited by the policy service) and supersedes the device's other open proposals; both
decisions are audited in the same transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from agent.wire import DeviceConfig
from service.audit import service as audit
from service.errors import Conflict, Forbidden, NotFound, Unprocessable
from service.policies import service as policies
from service.recommendations.schemas import RecommendationRead
from service.security import Principal, Role
from service.tables import Device, ModelVersion, Observation, Recommendation, ScheduledCanary


def to_read(row: Recommendation) -> RecommendationRead:
    current = DeviceConfig.model_validate(row.current_config) if row.current_config else None
    recommended = DeviceConfig.model_validate(row.recommended_config)
    return RecommendationRead.model_validate(
        {
            **{c.key: getattr(row, c.key) for c in Recommendation.__table__.columns},
            "current_config": current,
            "recommended_config": recommended,
            "next_canary": DeviceConfig.model_validate(row.next_canary)
            if row.next_canary
            else None,
            "changes_configuration": current != recommended,
        }
    )


def list_recommendations(
    session: Session,
    *,
    device_id: uuid.UUID | None,
    status: str | None,
    objective: str | None,
    limit: int,
    offset: int,
) -> Sequence[Recommendation]:
    query = select(Recommendation)
    if device_id is not None:
        query = query.where(Recommendation.device_id == device_id)
    if status is not None:
        query = query.where(Recommendation.status == status)
    if objective is not None:
        query = query.where(Recommendation.objective == objective)
    query = query.order_by(Recommendation.created_at.desc(), Recommendation.id)
    return session.scalars(query.limit(limit).offset(offset)).all()


def get(session: Session, recommendation_id: uuid.UUID, *, lock: bool = False) -> Recommendation:
    query = select(Recommendation).where(Recommendation.id == recommendation_id)
    found = session.scalars(query.with_for_update() if lock else query).one_or_none()
    if found is None:
        raise NotFound(f"no recommendation {recommendation_id}")
    return found


def _open(session: Session, recommendation_id: uuid.UUID) -> Recommendation:
    row = get(session, recommendation_id, lock=True)
    if row.status != "proposed":
        raise Conflict(
            f"recommendation {recommendation_id} is {row.status}; only a proposed one can be"
            " decided, nothing was changed"
        )
    return row


def accept(
    session: Session, operator: Principal, recommendation_id: uuid.UUID, reason: str
) -> RecommendationRead:
    row = _open(session, recommendation_id)
    config = DeviceConfig.model_validate(row.recommended_config)
    # refused (and nothing changed) if the device can no longer take it
    policies.set_policy(
        session, operator, row.device_id, config,
        f"recommendation {row.id} ({row.objective}): {reason}",
    )  # fmt: skip
    _decide(session, operator, row, "accepted", reason)
    session.execute(
        update(Recommendation)
        .where(Recommendation.device_id == row.device_id, Recommendation.status == "proposed",
               Recommendation.id != row.id)
        .values(status="superseded")
    )  # fmt: skip
    return to_read(row)


def reject(
    session: Session, operator: Principal, recommendation_id: uuid.UUID, reason: str
) -> RecommendationRead:
    row = _open(session, recommendation_id)
    _decide(session, operator, row, "rejected", reason)
    return to_read(row)


def _decide(
    session: Session, operator: Principal, row: Recommendation, status: str, reason: str
) -> None:
    row.status = status
    row.decided_by = operator.name
    row.decided_at = datetime.now(UTC)
    row.decision_reason = reason
    session.flush()
    audit.record(
        session, operator, f"recommendation.{status}", target_type="recommendation",
        target_id=row.id, before={"status": "proposed"},
        after={"status": status, "device_id": str(row.device_id),
               "config": row.recommended_config, "objective": row.objective},
        detail=reason,
    )  # fmt: skip


def model_versions(
    session: Session, *, run_id: uuid.UUID | None, limit: int, offset: int
) -> Sequence[ModelVersion]:
    query = select(ModelVersion)
    if run_id is not None:
        query = query.where(ModelVersion.run_id == run_id)
    query = query.order_by(ModelVersion.created_at.desc(), ModelVersion.device_class,
                           ModelVersion.objective)  # fmt: skip
    return session.scalars(query.limit(limit).offset(offset)).all()


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


def canaries_for_node(
    session: Session, principal: Principal, node_id: uuid.UUID
) -> Sequence[ScheduledCanary]:
    """The node's scheduled canaries, most promising first."""
    if not principal.may_act_for_node(node_id, Role.VIEWER):
        raise Forbidden("a node may read only its own canaries")
    query = (
        select(ScheduledCanary)
        .join(Device, Device.id == ScheduledCanary.device_id)
        .where(Device.node_id == node_id, ScheduledCanary.status == "scheduled")
        .order_by(ScheduledCanary.rank, ScheduledCanary.created_at)
    )
    return session.scalars(query).all()


def canary_done(
    session: Session, principal: Principal, canary_id: uuid.UUID, observation_id: uuid.UUID
) -> ScheduledCanary:
    """The node ran the canary and recorded its result as a canary observation."""
    canary = session.scalars(
        select(ScheduledCanary).where(ScheduledCanary.id == canary_id).with_for_update()
    ).one_or_none()
    if canary is None:
        raise NotFound(f"no scheduled canary {canary_id}")
    device = session.get(Device, canary.device_id)
    assert device is not None  # the foreign key
    if not principal.may_act_for_node(device.node_id, Role.OPERATOR):
        raise Forbidden("a node may report only its own devices' canaries")
    if canary.status != "scheduled":
        raise Conflict(f"canary {canary_id} is {canary.status}; nothing was changed")
    observation = session.get(Observation, observation_id)
    if observation is None or observation.device_id != canary.device_id:
        raise Unprocessable(
            f"observation {observation_id} is not a result on this canary's device",
            fields=[{"loc": ["body", "observation_id"], "msg": "not this device's"}],
        )
    if observation.kind != "canary":
        raise Unprocessable(
            f"observation {observation_id} is a {observation.kind}, not a canary",
            fields=[{"loc": ["body", "observation_id"], "msg": "not a canary"}],
        )
    canary.status = "done"
    session.flush()
    audit.record(
        session, principal, "canary.done", target_type="scheduled_canary", target_id=canary.id,
        before={"status": "scheduled"},
        after={"status": "done", "observation_id": str(observation_id),
               "verdict": observation.verdict},
    )  # fmt: skip
    return canary
