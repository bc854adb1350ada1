from __future__ import annotations

import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from models.priors import Objective
from service.deps import (
    API_PREFIX,
    MAX_OFFSET,
    AdminAuth,
    AnyPrincipal,
    AuthFirstRoute,
    OperatorAuth,
    SessionDep,
    ViewerAuth,
)
from service.errors import Conflict, Forbidden, NotFound, Unauthorized, Unprocessable, responses
from service.recommendations import service
from service.recommendations.schemas import (
    Acceptance,
    CanaryDone,
    Decision,
    ModelVersionRead,
    NightlyRequest,
    NightlyRunRead,
    RecommendationRead,
    ScheduledCanaryRead,
    Status,
)

router = APIRouter(prefix=API_PREFIX, tags=["recommendations"], route_class=AuthFirstRoute)


@router.get(
    "/recommendations",
    response_model=list[RecommendationRead],
    responses=responses(Unauthorized, Forbidden),
)
def list_recommendations(
    session: SessionDep,
    _: ViewerAuth,
    device_id: uuid.UUID | None = None,
    status: Status | None = None,
    objective: Objective | None = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[RecommendationRead]:
    """Newest first: per device and objective, the current against the recommended
    configuration, the predicted change per objective with intervals, confidence, evidence
    and a plain-language reason."""
    rows = service.list_recommendations(
        session,
        device_id=device_id,
        status=status,
        objective=objective,
        limit=limit,
        offset=offset,
    )
    return [service.to_read(row) for row in rows]


@router.get(
    "/recommendations/{recommendation_id}",
    response_model=RecommendationRead,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_recommendation(
    recommendation_id: uuid.UUID, session: SessionDep, _: ViewerAuth
) -> RecommendationRead:
    return service.to_read(service.get(session, recommendation_id))


@router.post(
    "/recommendations/{recommendation_id}/accept",
    response_model=RecommendationRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def accept(
    recommendation_id: uuid.UUID, body: Acceptance, session: SessionDep, operator: OperatorAuth
) -> RecommendationRead:
    """Try the recommended configuration on its device under a canary (a one-device rollout,
    its id in `rollout_id`) and keep it only if the canary passes and the soak holds: the
    status is then `verifying`, later `kept` or `rolled_back`. `without_canary` pins it at
    once instead (`applied`), an audited choice."""
    return service.accept(session, operator, recommendation_id, body)


@router.post(
    "/recommendations/{recommendation_id}/revert",
    response_model=RecommendationRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def revert(
    recommendation_id: uuid.UUID, body: Decision, session: SessionDep, operator: OperatorAuth
) -> RecommendationRead:
    """Undo in one step: the device goes back to exactly what it had before this
    recommendation's change (unmanaged if it was), and the recommendation reads `reverted`."""
    return service.revert(session, operator, recommendation_id, body.reason)


@router.post(
    "/recommendations/{recommendation_id}/reject",
    response_model=RecommendationRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def reject(
    recommendation_id: uuid.UUID, body: Decision, session: SessionDep, operator: OperatorAuth
) -> RecommendationRead:
    return service.reject(session, operator, recommendation_id, body.reason)


@router.get(
    "/model-versions",
    response_model=list[ModelVersionRead],
    responses=responses(Unauthorized, Forbidden),
)
def model_versions(
    session: SessionDep,
    _: ViewerAuth,
    run_id: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[ModelVersionRead]:
    """Trained models with their training-data range and evaluation scores."""
    rows = service.model_versions(session, run_id=run_id, limit=limit, offset=offset)
    return [ModelVersionRead.model_validate(row) for row in rows]


@router.get(
    "/canaries",
    response_model=list[ScheduledCanaryRead],
    responses=responses(Unauthorized, Forbidden),
)
def scheduled_canaries(
    session: SessionDep,
    _: ViewerAuth,
    device_id: uuid.UUID | None = None,
    status: Literal["scheduled", "done", "cancelled"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[ScheduledCanaryRead]:
    """Canaries the nightly job scheduled, most promising first."""
    rows = service.scheduled_canaries(
        session, device_id=device_id, status=status, limit=limit, offset=offset
    )
    return service.canary_reads(session, rows)


@router.get(
    "/nodes/{node_id}/canaries",
    response_model=list[ScheduledCanaryRead],
    responses=responses(Unauthorized, Forbidden),
)
def node_canaries(
    node_id: uuid.UUID, session: SessionDep, principal: AnyPrincipal
) -> list[ScheduledCanaryRead]:
    """The node's scheduled canaries, most promising first (the node itself, or a viewer)."""
    rows = service.canaries_for_node(session, principal, node_id)
    return service.canary_reads(session, rows)


@router.post(
    "/canaries/{canary_id}/done",
    response_model=ScheduledCanaryRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def canary_done(
    canary_id: uuid.UUID, body: CanaryDone, session: SessionDep, principal: AnyPrincipal
) -> ScheduledCanaryRead:
    """The node ran it: the canary observation it recorded closes the scheduled canary."""
    row = service.canary_done(session, principal, canary_id, body.observation_id)
    return ScheduledCanaryRead.model_validate(row)


@router.post(
    "/nightly-runs",
    response_model=NightlyRunRead,
    status_code=202,
    responses=responses(Unauthorized, Forbidden, Conflict, Unprocessable),
)
def queue_nightly(body: NightlyRequest, session: SessionDep, admin: AdminAuth) -> NightlyRunRead:
    """Queue the nightly job — retrain every model, re-score every device's recommendations,
    schedule canaries — for the service's nightly worker; follow it at its URL. One at a time:
    409 while one is queued or running."""
    return NightlyRunRead.model_validate(service.queue_nightly(session, body, admin))


@router.get(
    "/nightly-runs",
    response_model=list[NightlyRunRead],
    responses=responses(Unauthorized, Forbidden),
)
def list_nightly_runs(
    session: SessionDep,
    _: ViewerAuth,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 20,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[NightlyRunRead]:
    """Nightly runs queued through the API, newest first, with their reports."""
    rows = service.nightly_runs(session, limit=limit, offset=offset)
    return [NightlyRunRead.model_validate(row) for row in rows]


@router.get(
    "/nightly-runs/{run_id}",
    response_model=NightlyRunRead,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_nightly_run(run_id: uuid.UUID, session: SessionDep, _: ViewerAuth) -> NightlyRunRead:
    """One run: queued, running (since started_at), done with its report, or failed and why."""
    return NightlyRunRead.model_validate(service.nightly_run(session, run_id))
