"""Rollouts as operators see them: started (checked whole before anything is stored), listed,
paused, resumed, aborted. The worker (service.rollouts.engine) carries them out."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from agent.bench.library import library
from service.audit import service as audit
from service.errors import Conflict, NotFound, Unprocessable
from service.policies.service import check_device_can_take
from service.rollouts import repository
from service.rollouts.schemas import (
    CanarySettings,
    Guardrails,
    RolloutCreate,
    RolloutRead,
    RolloutTargetRead,
    StageRead,
)
from service.security import Principal
from service.tables import Rollout, RolloutTarget

NOT_TOUCHED = ("pending",)


def plan_stages(specs: Sequence[str], nodes: int) -> list[int]:
    """Cumulative node counts per stage, strictly increasing, the last one every node.
    "1" is one node, "10%" is a tenth of them (at least one more than the stage before)."""
    counts: list[int] = []
    for spec in specs:
        wanted = math.ceil(nodes * int(spec[:-1]) / 100) if spec.endswith("%") else int(spec)
        wanted = min(nodes, max(wanted, (counts[-1] + 1) if counts else 1))
        if not counts or wanted > counts[-1]:
            counts.append(wanted)
    if not counts or counts[-1] != nodes:
        raise Unprocessable(
            f"the last stage must reach every one of the {nodes} nodes (end with 100%);"
            " nothing was changed",
            fields=[{"loc": ["body", "stages"], "msg": "the last stage must be 100%"}],
        )
    return counts


def _refuse(message: str, loc: list[str], problems: list[str]) -> Unprocessable:
    shown = "; ".join(problems[:20]) + (
        f" (and {len(problems) - 20} more)" if len(problems) > 20 else ""
    )
    return Unprocessable(
        f"{message}: {shown}; nothing was changed",
        fields=[{"loc": loc, "msg": problem} for problem in problems[:100]],
    )


def create(session: Session, operator: Principal, body: RolloutCreate) -> RolloutRead:
    """Every device the target names must exist, be on its node, and be able to take the
    configuration; the canary's workload must exist; the stages must reach every node.
    Anything wrong is refused before a row is written."""
    if body.canary.workload not in library():
        raise Unprocessable(
            f"{body.canary.workload!r} is not a named workload; nothing was changed",
            fields=[{"loc": ["body", "canary", "workload"], "msg": "unknown workload"}],
        )
    selector = body.target
    if selector.device_ids:
        unknown = set(selector.device_ids) - repository.known_device_ids(
            session, selector.device_ids
        )
        if unknown:
            raise _refuse(
                "unknown devices",
                ["body", "target", "device_ids"],
                [f"no device {device_id}" for device_id in sorted(map(str, unknown))],
            )
    rows = repository.devices_with_nodes(
        session,
        device_class=selector.device_class,
        node_labels=dict(selector.node_labels),
        device_ids=list(selector.device_ids),
    )
    if not rows:
        raise Unprocessable(
            "the target matches no devices; nothing was changed",
            fields=[{"loc": ["body", "target"], "msg": "matches no devices"}],
        )
    problems: list[str] = []
    for device, node in rows:
        try:
            check_device_can_take(device, body.config)
        except Unprocessable as error:
            problems.append(f"{node.hostname}/{device.name}: {error.detail}")
    if problems:
        raise _refuse("the configuration does not suit every device", ["body", "config"], problems)
    hostnames = {node.hostname for _, node in rows}
    doubled = sorted(
        name for name, n in repository.hostnames_in_use(session, hostnames).items() if n > 1
    )
    if doubled:
        raise _refuse(
            "rollouts address nodes by hostname, and these name several nodes",
            ["body", "target"],
            doubled,
        )
    busy = repository.busy_devices(session, [device.id for device, _ in rows])
    if busy:
        raise Conflict(
            "devices already in an unfinished rollout: "
            + "; ".join(f"{name} in {rollout!r}" for name, rollout in busy[:20])
            + "; nothing was changed"
        )
    stages = plan_stages(body.stages, len(hostnames))
    order = sorted(hostnames)  # stage membership by hostname: stable and easy to predict
    stage_of = {
        host: next(i for i, n in enumerate(stages) if k < n) for k, host in enumerate(order)
    }
    rollout = Rollout(
        name=body.name,
        config=body.config.model_dump(mode="json"),
        target=selector.model_dump(mode="json", exclude_defaults=True),
        workload_name=body.canary.workload,
        canary=body.canary.model_dump(mode="json"),
        stages=stages,
        stage_specs=list(body.stages),
        serial=body.serial,
        max_fail_percentage=body.max_fail_percentage,
        soak_seconds=body.soak_seconds,
        guardrails=body.guardrails.model_dump(mode="json"),
        status="running",
        stage=0,
        phase="canary",
        reason=body.reason,
        status_detail="waiting for a worker",
        created_by=operator.name,
    )
    session.add(rollout)
    session.flush()
    for device, node in rows:
        session.add(
            RolloutTarget(
                rollout_id=rollout.id,
                device_id=device.id,
                node_id=node.id,
                hostname=node.hostname,
                device_name=device.name,
                stage=stage_of[node.hostname],
                status="pending",
                detail="",
                attempts=0,
            )
        )
    session.flush()
    audit.record(
        session,
        operator,
        "rollout.created",
        target_type="rollout",
        target_id=rollout.id,
        after={
            "config": rollout.config,
            "target": rollout.target,
            "stages": stages,
            "devices": len(rows),
            "nodes": len(hostnames),
        },
        detail=body.reason,
    )
    return to_read(session, rollout)


def get(session: Session, rollout_id: uuid.UUID, *, lock: bool = False) -> Rollout:
    rollout = repository.get(session, rollout_id, lock=lock)
    if rollout is None:
        raise NotFound(f"no rollout {rollout_id}")
    return rollout


def _stage_status(rollout: Rollout, index: int, targets: Sequence[RolloutTarget]) -> str:
    statuses = {t.status for t in targets}
    if statuses & {"rolled_back", "rolling_back", "restore_failed"}:
        return "rolled_back"
    if "failed" in statuses and index == rollout.stage:
        return "failed"
    if index < rollout.stage or rollout.status == "succeeded":
        return "passed"
    if index > rollout.stage:
        return "pending"
    if rollout.status == "paused":
        return "paused"
    return rollout.phase


def to_read(session: Session, rollout: Rollout) -> RolloutRead:
    targets = repository.targets(session, rollout.id)
    counts: dict[str, int] = {}
    for target in targets:
        counts[target.status] = counts.get(target.status, 0) + 1
    stages = []
    for index, spec in enumerate(rollout.stage_specs[: len(rollout.stages)]):
        own = [t for t in targets if t.stage == index]
        stages.append(
            StageRead(
                index=index,
                spec=spec,
                hosts=sorted({t.hostname for t in own}),
                status=_stage_status(rollout, index, own),
            )
        )
    return RolloutRead(
        id=rollout.id,
        name=rollout.name,
        status=rollout.status,
        status_detail=rollout.status_detail,
        config=rollout.config,
        target=rollout.target,
        workload_name=rollout.workload_name,
        canary=CanarySettings.model_validate(rollout.canary),
        guardrails=Guardrails.model_validate(rollout.guardrails),
        serial=rollout.serial,
        max_fail_percentage=rollout.max_fail_percentage,
        soak_seconds=rollout.soak_seconds,
        stage=rollout.stage,
        phase=rollout.phase,
        soak_until=rollout.soak_until,
        stages=stages,
        counts=counts,
        targets=[RolloutTargetRead.model_validate(t) for t in targets],
        reason=rollout.reason,
        created_by=rollout.created_by,
        created_at=rollout.created_at,
        updated_at=rollout.updated_at,
        finished_at=rollout.finished_at,
    )


def list_rollouts(
    session: Session, *, status: str | None, limit: int, offset: int
) -> list[RolloutRead]:
    rows = repository.list_rollouts(session, status=status, limit=limit, offset=offset)
    return [to_read(session, row) for row in rows]


def _transition(
    session: Session,
    operator: Principal,
    rollout_id: uuid.UUID,
    action: str,
    reason: str,
    allowed: tuple[str, ...],
    new_status: str,
    **changes: Any,
) -> RolloutRead:
    rollout = get(session, rollout_id, lock=True)
    if rollout.status not in allowed:
        raise Conflict(
            f"rollout {rollout.name!r} is {rollout.status}; it can be {action}d only when"
            f" {' or '.join(allowed)}"
        )
    before = {"status": rollout.status, "stage": rollout.stage}
    rollout.status = new_status
    rollout.status_detail = f"{action}d by {operator.name}: {reason}"
    rollout.updated_at = datetime.now(UTC)
    for name, value in changes.items():
        setattr(rollout, name, value)
    audit.record(
        session,
        operator,
        f"rollout.{action}d",
        target_type="rollout",
        target_id=rollout.id,
        before=before,
        after={"status": new_status},
        detail=reason,
    )
    session.flush()
    return to_read(session, rollout)


def pause(session: Session, operator: Principal, rollout_id: uuid.UUID, reason: str) -> RolloutRead:
    """Stops after the step under way (a stage's canaries finish; no new stage starts)."""
    return _transition(session, operator, rollout_id, "pause", reason, ("running",), "paused")


def resume(
    session: Session, operator: Principal, rollout_id: uuid.UUID, reason: str
) -> RolloutRead:
    """Goes on; devices whose canary was inconclusive get their canary again."""
    rollout = get(session, rollout_id, lock=True)
    for target in repository.targets(session, rollout.id):
        if target.status == "inconclusive":
            target.status = "pending"
            target.detail = f"canary again after resume: {target.detail}"[:2000]
    return _transition(session, operator, rollout_id, "resume", reason, ("paused",), "running")


def abort(session: Session, operator: Principal, rollout_id: uuid.UUID, reason: str) -> RolloutRead:
    """Puts back every device the rollout changed (also after it succeeded: 'roll back')."""
    return _transition(
        session,
        operator,
        rollout_id,
        "abort",
        reason,
        ("running", "paused", "succeeded"),
        "rolling_back",
        finished_at=None,
    )
