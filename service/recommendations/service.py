"""Recommendations from the nightly job: listed, read, and decided by an operator. Accepting
one makes its configuration the device's policy (checked against what the device can take,
audited by the policy service) and supersedes the device's other open proposals; both
decisions are audited in the same transaction. A canary of a recommended configuration binds
the recommendation: a fail refutes it (it can no longer be accepted), an inconclusive one
leaves it unproven, and either way it carries the canary's measured effect beside the
prediction."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from agent.contract.metrics import METRICS
from agent.contract.tunables import DeviceConfig
from service.audit import service as audit
from service.errors import Conflict, Forbidden, NotFound, Unprocessable
from service.policies import service as policies
from service.recommendations import repository
from service.recommendations.schemas import RecommendationRead, ScheduledCanaryRead
from service.security import Principal, Role
from service.tables import ModelVersion, Observation, RecommendationRow, ScheduledCanary


def to_read(row: RecommendationRow) -> RecommendationRead:
    current = DeviceConfig.model_validate(row.current_config) if row.current_config else None
    recommended = DeviceConfig.model_validate(row.recommended_config)
    return RecommendationRead.model_validate(
        {
            **{c.key: getattr(row, c.key) for c in RecommendationRow.__table__.columns},
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
) -> Sequence[RecommendationRow]:
    return repository.list_recommendations(
        session,
        device_id=device_id,
        status=status,
        objective=objective,
        limit=limit,
        offset=offset,
    )


def get(session: Session, recommendation_id: uuid.UUID, *, lock: bool = False) -> RecommendationRow:
    found = repository.get(session, recommendation_id, lock=lock)
    if found is None:
        raise NotFound(f"no recommendation {recommendation_id}")
    return found


def _open(session: Session, recommendation_id: uuid.UUID) -> RecommendationRow:
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
        session,
        operator,
        row.device_id,
        config,
        f"recommendation {row.id} ({row.objective}): {reason}",
    )
    superseded = repository.supersede_proposals(session, row.device_id, keep=row.id)
    _decide(session, operator, row, "accepted", reason, superseded=superseded)
    return to_read(row).model_copy(update={"superseded": superseded})


def reject(
    session: Session, operator: Principal, recommendation_id: uuid.UUID, reason: str
) -> RecommendationRead:
    row = _open(session, recommendation_id)
    _decide(session, operator, row, "rejected", reason)
    return to_read(row)


def _decide(
    session: Session,
    operator: Principal,
    row: RecommendationRow,
    status: str,
    reason: str,
    *,
    superseded: Sequence[uuid.UUID] = (),
) -> None:
    row.status = status
    row.decided_by = operator.name
    row.decided_at = datetime.now(UTC)
    row.decision_reason = reason
    session.flush()
    audit.record(
        session,
        operator,
        f"recommendation.{status}",
        target_type="recommendation",
        target_id=row.id,
        before={"status": "proposed"},
        after={
            "status": status,
            "device_id": str(row.device_id),
            "config": row.recommended_config,
            "objective": row.objective,
            **({"superseded": [str(i) for i in superseded]} if superseded else {}),
        },
        detail=reason,
    )


def canary_judged(
    session: Session, principal: Principal, observation: Observation
) -> list[RecommendationRow]:
    """A canary's verdict on the device's open recommendations of the configuration it
    measured (made before it finished): each carries the canary; a fail refutes it."""
    if observation.kind != "canary" or observation.verdict is None:
        return []
    measured = DeviceConfig.model_validate(observation.configuration)
    bound = []
    for row in repository.proposed_for_device(session, observation.device_id):
        if row.created_at > observation.finished_at:
            continue
        if DeviceConfig.model_validate(row.recommended_config) != measured:
            continue
        row.canary = canary_summary(observation)
        if observation.verdict == "fail":
            row.status = "refuted"
            audit.record(
                session,
                principal,
                "recommendation.refuted",
                target_type="recommendation",
                target_id=row.id,
                before={"status": "proposed"},
                after={"status": "refuted", "observation_id": str(observation.id)},
                detail=f"its canary failed ({observation.workload_name})",
            )
        bound.append(row)
    session.flush()
    return bound


def canary_summary(observation: Observation) -> dict[str, object]:
    """The canary as a recommendation shows it: its verdict, when, and each metric's measured
    gain (improvement, higher is better; relative) with its interval, baseline and candidate
    medians in the metric's unit."""
    stats = observation.statistics or {}
    effects: dict[str, dict[str, object]] = {}
    for key in sorted(stats):
        name, _, field = key.rpartition(".")
        if field != "relative_shift":
            continue
        known = METRICS.get(name)
        direction = stats.get(f"{name}.higher_is_better")
        if direction is None and known is None:
            continue  # an older agent's metric whose direction is not known here
        higher = (
            bool(direction) if direction is not None else bool(known and known.higher_is_better)
        )
        base = float(stats.get(f"{name}.baseline_median", 0.0))
        scale = abs(base) or 1.0
        low = float(stats.get(f"{name}.ci_low", 0.0)) / scale
        high = float(stats.get(f"{name}.ci_high", 0.0)) / scale
        change = float(stats[key])
        candidate = stats.get(f"{name}.candidate_median")
        if not all(math.isfinite(x) for x in (base, low, high, change, float(candidate or 0.0))):
            continue  # a baseline near zero makes the relative figures meaningless
        effects[name] = {
            "label": known.label if known else name,
            "unit": known.unit if known else "",
            "higher_is_better": higher,
            "gain": change if higher else -change,
            "gain_low": low if higher else -high,
            "gain_high": high if higher else -low,
            "baseline": base,
            "candidate": candidate,
            "confidence": stats.get(f"{name}.confidence"),
        }
    return {
        "observation_id": str(observation.id),
        "verdict": observation.verdict,
        "finished_at": observation.finished_at.isoformat(),
        "workload": observation.workload_name,
        "effects": effects,
    }


def counts_by_status(session: Session) -> dict[str, int]:
    """How many recommendations stand in each status: proposed, accepted, rejected,
    superseded (by an accepted one for the same device, or a later nightly run), refuted."""
    return repository.counts_by_status(session)


def model_versions(
    session: Session, *, run_id: uuid.UUID | None, limit: int, offset: int
) -> Sequence[ModelVersion]:
    return repository.model_versions(session, run_id=run_id, limit=limit, offset=offset)


def scheduled_canaries(
    session: Session, *, device_id: uuid.UUID | None, status: str | None, limit: int, offset: int
) -> Sequence[ScheduledCanary]:
    return repository.scheduled_canaries(
        session, device_id=device_id, status=status, limit=limit, offset=offset
    )


def canaries_for_node(
    session: Session, principal: Principal, node_id: uuid.UUID
) -> Sequence[ScheduledCanary]:
    """The node's scheduled canaries, most promising first."""
    if not principal.may_act_for_node(node_id, Role.VIEWER):
        raise Forbidden("a node may read only its own canaries")
    return repository.canaries_for_node(session, node_id)


def canary_reads(session: Session, rows: Sequence[ScheduledCanary]) -> list[ScheduledCanaryRead]:
    """Scheduled canaries as the API shows them: each with the prediction, for the canary's
    objective, of the device's open recommendation of the same configuration, where there is
    one."""
    reads = []
    proposals: dict[uuid.UUID, Sequence[RecommendationRow]] = {}
    for row in rows:
        if row.device_id not in proposals:
            proposals[row.device_id] = repository.proposals(session, row.device_id)
        read = ScheduledCanaryRead.model_validate(row)
        config = DeviceConfig.model_validate(row.config)
        for proposal in proposals[row.device_id]:
            if DeviceConfig.model_validate(proposal.recommended_config) != config:
                continue
            prediction = to_read(proposal).predictions.get(row.objective)
            read = read.model_copy(
                update={"recommendation_id": proposal.id, "prediction": prediction}
            )
            break
        reads.append(read)
    return reads


def canary_done(
    session: Session, principal: Principal, canary_id: uuid.UUID, observation_id: uuid.UUID
) -> ScheduledCanary:
    """The node ran the canary and recorded its result as a canary observation."""
    canary = repository.scheduled_canary(session, canary_id)
    if canary is None:
        raise NotFound(f"no scheduled canary {canary_id}")
    device = repository.device(session, canary.device_id)
    assert device is not None  # the foreign key
    if not principal.may_act_for_node(device.node_id, Role.OPERATOR):
        raise Forbidden("a node may report only its own devices' canaries")
    if canary.status != "scheduled":
        raise Conflict(f"canary {canary_id} is {canary.status}; nothing was changed")
    observation = repository.observation(session, observation_id)
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
        session,
        principal,
        "canary.done",
        target_type="scheduled_canary",
        target_id=canary.id,
        before={"status": "scheduled"},
        after={
            "status": "done",
            "observation_id": str(observation_id),
            "verdict": observation.verdict,
        },
    )
    return canary
