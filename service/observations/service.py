from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from agent.contract.base import MAX_CLOCK_SKEW
from agent.contract.wire import ObservationCreate, ObservationKind
from service.devices import repository as device_repository
from service.errors import Forbidden, NotFound, Unprocessable
from service.observations import repository
from service.recommendations import service as recommendations
from service.security import Principal, Role
from service.tables import Observation


def record(session: Session, principal: Principal, body: ObservationCreate) -> Observation:
    """A node records results for its own devices; an operator for any device."""
    device = device_repository.get(session, body.device_id)
    if device is None:
        raise Unprocessable(
            f"device {body.device_id} does not exist",
            fields=[{"loc": ["body", "device_id"], "msg": "unknown device"}],
        )
    if not principal.may_act_for_node(device.node_id, Role.OPERATOR):
        raise Forbidden("a node may record observations only for its own devices")
    latest = datetime.now(UTC) + MAX_CLOCK_SKEW
    if body.finished_at > latest:
        raise Unprocessable(
            f"finished_at {body.finished_at.isoformat()} is more than {MAX_CLOCK_SKEW} past this"
            " server's clock: check the node's clock (NTP); nothing was stored",
            fields=[{"loc": ["body", "finished_at"], "msg": "in the future"}],
        )
    scheduler = body.configuration.scheduler
    if (
        scheduler is not None
        and device.available_schedulers
        and scheduler.value not in device.available_schedulers
    ):
        raise Unprocessable(
            f"device {device.name} does not offer scheduler {scheduler.value}"
            f" (it offers {', '.join(device.available_schedulers)})",
            fields=[{"loc": ["body", "configuration", "scheduler"], "msg": "not available"}],
        )
    observation = repository.add(
        session,
        Observation(
            device_id=device.id,
            kind=body.kind.value,
            tool=body.tool,
            workload_name=body.workload.name,
            workload=body.workload.model_dump(mode="json"),
            configuration=body.configuration.model_dump(mode="json"),
            metrics=dict(body.metrics),
            statistics=dict(body.statistics),
            verdict=body.verdict.value if body.verdict else None,
            started_at=body.started_at,
            finished_at=body.finished_at,
            recorded_by=principal.name,
        ),
    )
    recommendations.canary_judged(session, principal, observation)
    return observation


def get(session: Session, principal: Principal, observation_id: uuid.UUID) -> Observation:
    observation = repository.get(session, observation_id)
    if observation is None:
        raise NotFound(f"no observation {observation_id}")
    device = device_repository.get(session, observation.device_id)
    if device is None or not principal.may_act_for_node(device.node_id, Role.VIEWER):
        raise Forbidden("a node may read only its own devices' observations")
    return observation


def list_observations(
    session: Session,
    *,
    device_id: uuid.UUID | None,
    kind: ObservationKind | None,
    workload_name: str | None,
    limit: int,
    offset: int,
) -> Sequence[Observation]:
    return repository.list_observations(
        session,
        device_id=device_id,
        kind=kind.value if kind else None,
        workload_name=workload_name,
        limit=limit,
        offset=offset,
    )
