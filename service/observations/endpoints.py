from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from agent.contract.base import SafeText
from agent.contract.wire import ObservationCreate, ObservationKind
from service.deps import (
    API_PREFIX,
    MAX_OFFSET,
    AnyPrincipal,
    AuthFirstRoute,
    SessionDep,
    ViewerAuth,
)
from service.errors import Forbidden, NotFound, Unauthorized, Unprocessable, responses
from service.observations import service
from service.observations.schemas import ObservationRead

router = APIRouter(
    prefix=f"{API_PREFIX}/observations", tags=["observations"], route_class=AuthFirstRoute
)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ObservationRead,
    responses=responses(Unauthorized, Forbidden, Unprocessable),
)
def record_observation(
    body: ObservationCreate, session: SessionDep, principal: AnyPrincipal
) -> ObservationRead:
    """A benchmark or canary result, from a node for its own device or from an operator."""
    return ObservationRead.model_validate(service.record(session, principal, body))


@router.get("", response_model=list[ObservationRead], responses=responses(Unauthorized, Forbidden))
def list_observations(
    session: SessionDep,
    _: ViewerAuth,
    device_id: uuid.UUID | None = None,
    kind: ObservationKind | None = None,
    workload: SafeText | None = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[ObservationRead]:
    observations = service.list_observations(
        session, device_id=device_id, kind=kind, workload_name=workload, limit=limit, offset=offset
    )
    return [ObservationRead.model_validate(o) for o in observations]


@router.get(
    "/{observation_id}",
    response_model=ObservationRead,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_observation(
    observation_id: uuid.UUID, session: SessionDep, principal: AnyPrincipal
) -> ObservationRead:
    return ObservationRead.model_validate(service.get(session, principal, observation_id))
