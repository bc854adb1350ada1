"""Recommendations from the nightly job: listed, read, and decided by an operator. Accepting
one tries its configuration on the device under a canary (a one-device rollout) and keeps it
only if it holds; it supersedes the device's other open proposals; every decision is audited
in the same transaction. A canary of a recommended configuration binds
the recommendation: a fail refutes it (it can no longer be accepted), an inconclusive one
leaves it unproven, and either way it carries the canary's measured effect beside the
prediction."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from agent.bench.library import library
from agent.contract.metrics import METRICS
from agent.contract.tunables import DeviceConfig
from service.audit import service as audit
from service.errors import Conflict, Forbidden, NotFound, Unprocessable
from service.policies import service as policies
from service.recommendations import repository
from service.recommendations.schemas import (
    Acceptance,
    NightlyRequest,
    RecommendationRead,
    ScheduledCanaryRead,
)
from service.rollouts import service as rollouts
from service.rollouts.schemas import RolloutCreate
from service.security import Principal, Role
from service.tables import (
    ModelVersion,
    NightlyRun,
    Observation,
    RecommendationRow,
    Rollout,
    ScheduledCanary,
)


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
    session: Session, operator: Principal, recommendation_id: uuid.UUID, decision: Acceptance
) -> RecommendationRead:
    """Try the recommended configuration on its device and keep it only if it holds: a
    one-device rollout through the fleet's engine and gates (canary on the recommendation's
    workload — live on the device's own traffic where it holds data — then a soak under the
    guardrails). The recommendation is 'verifying' until the rollout ends: 'kept' or
    'rolled_back'. Or, as an explicit choice, pinned at once without a canary ('applied').
    Refused, with nothing changed, if the device cannot take the configuration or is already
    in an unfinished rollout."""
    row = _open(session, recommendation_id)
    config = DeviceConfig.model_validate(row.recommended_config)
    reason = decision.reason
    if decision.without_canary:
        policies.set_policy(
            session,
            operator,
            row.device_id,
            config,
            f"recommendation {row.id} ({row.objective}) applied without a canary: {reason}",
        )
        status = "applied"
    else:
        workload = row.workload_name if row.workload_name in library() else None
        rollout = rollouts.create(
            session,
            operator,
            RolloutCreate.model_validate(
                {
                    "name": f"recommendation {str(row.id)[:8]}",
                    "config": row.recommended_config,
                    "target": {"device_ids": [row.device_id]},
                    "stages": ["100%"],
                    "soak_seconds": decision.soak_seconds,
                    "canary": {
                        **({"workload": workload} if workload else {}),
                        "on_inconclusive": decision.on_inconclusive,
                    },
                    "reason": f"recommendation {row.id} ({row.objective}) accepted: {reason}",
                }
            ),
        )
        row.rollout_id = rollout.id
        status = "verifying"
    superseded = repository.supersede_proposals(session, row.device_id, keep=row.id)
    action = "applied" if decision.without_canary else "accepted"
    _decide(session, operator, row, status, reason, superseded=superseded, action=action)
    return to_read(row).model_copy(update={"superseded": superseded})


def rollout_finished(session: Session, rollout: Rollout) -> None:
    """Called by the rollout engine when a rollout ends: a recommendation it was verifying is
    kept (every canary passed, the soak held) or rolled back (the device is as it was); one it
    had kept is rolled back when the rollout is (an operator aborted it after it succeeded).
    One an operator reverted stays reverted."""
    rolled_back = rollout.status != "succeeded"
    for row in repository.following(session, rollout.id):
        if row.status == "kept" and not rolled_back:
            continue
        was, status = row.status, "rolled_back" if rolled_back else "kept"
        row.status = status
        session.flush()
        audit.record(
            session,
            Principal(name=f"rollout:{rollout.name}"),
            f"recommendation.{status}",
            target_type="recommendation",
            target_id=row.id,
            before={"status": was},
            after={"status": status, "rollout_id": str(rollout.id), "rollout": rollout.status},
            detail=rollout.status_detail[:2000],
        )


def revert(
    session: Session, operator: Principal, recommendation_id: uuid.UUID, reason: str
) -> RecommendationRead:
    """Undo, in one step: the device goes back to exactly what it had before this
    recommendation's change — its rollout is rolled back (each device put back as captured, the
    policy it replaced restored, or none if it had none); a configuration pinned without a
    canary is replaced by what came before it (and, if the device had no policy, the device
    is released once its agent has put it back). The recommendation then reads 'reverted'."""
    row = get(session, recommendation_id, lock=True)
    if row.status not in ("verifying", "kept", "applied", "accepted"):
        raise Conflict(
            f"recommendation {recommendation_id} is {row.status}; only a change blkpilot made"
            " (verifying, kept, applied) can be reverted, nothing was changed"
        )
    was = row.status
    if row.rollout_id is not None and was in ("verifying", "kept"):
        rollouts.abort(session, operator, row.rollout_id, f"recommendation reverted: {reason}")
    else:
        policies.undo_policy(
            session,
            operator,
            row.device_id,
            f"recommendation {row.id} reverted: {reason}",
            set_for=f"recommendation {row.id}",
        )
    row.status = "reverted"
    row.decided_by, row.decided_at = operator.name, datetime.now(UTC)
    row.decision_reason = reason
    session.flush()
    audit.record(
        session,
        operator,
        "recommendation.reverted",
        target_type="recommendation",
        target_id=row.id,
        before={"status": was},
        after={"status": "reverted", "device_id": str(row.device_id)},
        detail=reason,
    )
    return to_read(row)


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
    action: str | None = None,
) -> None:
    row.status = status
    row.decided_by = operator.name
    row.decided_at = datetime.now(UTC)
    row.decision_reason = reason
    session.flush()
    audit.record(
        session,
        operator,
        f"recommendation.{action or status}",
        target_type="recommendation",
        target_id=row.id,
        before={"status": "proposed"},
        after={
            "status": status,
            "device_id": str(row.device_id),
            "config": row.recommended_config,
            "objective": row.objective,
            **({"rollout_id": str(row.rollout_id)} if row.rollout_id else {}),
            **({"superseded": [str(i) for i in superseded]} if superseded else {}),
        },
        detail=reason,
    )


def canary_judged(
    session: Session, principal: Principal, observation: Observation
) -> list[RecommendationRow]:
    """A canary's verdict on the device's open recommendations of the configuration it
    measured (made before it finished) and on the one its rollout is verifying: each carries
    the canary; a fail refutes a proposed one (a verifying one is rolled back by its rollout)."""
    if observation.kind != "canary" or observation.verdict is None:
        return []
    measured = DeviceConfig.model_validate(observation.configuration)
    bound = []
    for row in repository.open_for_device(session, observation.device_id):
        if row.created_at > observation.finished_at:
            continue
        if DeviceConfig.model_validate(row.recommended_config) != measured:
            continue
        row.canary = canary_summary(observation)
        if observation.verdict == "fail" and row.status == "proposed":
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


# --- nightly runs queued through the API ------------------------------------------------------


def queue_nightly(session: Session, body: NightlyRequest, principal: Principal) -> NightlyRun:
    """A nightly run for the service's nightly worker; one at a time (each retrains every
    model and replaces the scheduled canaries): 409 while one is queued or running."""
    open_run = repository.nightly_run_open(session)
    if open_run is not None:
        raise Conflict(f"nightly run {open_run.id} is {open_run.status}: one at a time")
    run = NightlyRun(
        status="queued", options=body.model_dump(mode="json"), requested_by=principal.name
    )
    repository.add(session, run)
    repository.flush(session)
    audit.record(
        session,
        principal,
        "nightly.queued",
        target_type="nightly_run",
        target_id=run.id,
        after=run.options,
    )
    return run


def nightly_run(session: Session, run_id: uuid.UUID) -> NightlyRun:
    found = repository.nightly_run(session, run_id)
    if found is None:
        raise NotFound(f"no nightly run {run_id}")
    return found


def nightly_runs(session: Session, *, limit: int, offset: int) -> Sequence[NightlyRun]:
    return repository.nightly_runs(session, limit=limit, offset=offset)
