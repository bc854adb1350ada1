from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from service.deps import (
    API_PREFIX,
    MAX_OFFSET,
    AuthFirstRoute,
    OperatorAuth,
    SessionDep,
    ViewerAuth,
)
from service.errors import Conflict, Forbidden, NotFound, Unauthorized, Unprocessable, responses
from service.rollouts import service
from service.rollouts.schemas import RolloutAction, RolloutCreate, RolloutRead, RolloutStatus

router = APIRouter(prefix=API_PREFIX, tags=["rollouts"], route_class=AuthFirstRoute)


@router.post(
    "/rollouts",
    status_code=status.HTTP_201_CREATED,
    response_model=RolloutRead,
    responses=responses(Unauthorized, Forbidden, Conflict, Unprocessable),
)
def create_rollout(body: RolloutCreate, session: SessionDep, operator: OperatorAuth) -> RolloutRead:
    """Roll a configuration out to the target's devices in stages. Checked whole before anything
    is stored: unknown devices, an empty target, a configuration a device cannot take, a device
    already in another rollout are refused. The service's worker then runs each stage's canaries
    with ansible, gates, soaks, and rolls back on a failure."""
    return service.create(session, operator, body)


@router.get(
    "/rollouts", response_model=list[RolloutRead], responses=responses(Unauthorized, Forbidden)
)
def list_rollouts(
    session: SessionDep,
    _: ViewerAuth,
    status: RolloutStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[RolloutRead]:
    """Newest first, with stages, each device's outcome and counts."""
    return service.list_rollouts(session, status=status, limit=limit, offset=offset)


@router.get(
    "/rollouts/{rollout_id}",
    response_model=RolloutRead,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_rollout(rollout_id: uuid.UUID, session: SessionDep, _: ViewerAuth) -> RolloutRead:
    return service.to_read(session, service.get(session, rollout_id))


@router.post(
    "/rollouts/{rollout_id}/pause",
    response_model=RolloutRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def pause(
    rollout_id: uuid.UUID, body: RolloutAction, session: SessionDep, operator: OperatorAuth
) -> RolloutRead:
    """No new step starts; canaries under way finish."""
    return service.pause(session, operator, rollout_id, body.reason)


@router.post(
    "/rollouts/{rollout_id}/resume",
    response_model=RolloutRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def resume(
    rollout_id: uuid.UUID, body: RolloutAction, session: SessionDep, operator: OperatorAuth
) -> RolloutRead:
    """Go on; inconclusive canaries are run again."""
    return service.resume(session, operator, rollout_id, body.reason)


@router.post(
    "/rollouts/{rollout_id}/abort",
    response_model=RolloutRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def abort(
    rollout_id: uuid.UUID, body: RolloutAction, session: SessionDep, operator: OperatorAuth
) -> RolloutRead:
    """Stop and put back every device the rollout changed (also after it succeeded)."""
    return service.abort(session, operator, rollout_id, body.reason)
