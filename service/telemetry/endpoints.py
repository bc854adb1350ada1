from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response, status

from agent.contract.wire import TelemetryBatch, TelemetryBatchReceipt
from service.bodies import fast_json_body, request_schema
from service.db import get_session
from service.deps import (
    API_PREFIX,
    AnyPrincipal,
    AuthFirstRoute,
    CurrentNode,
    SessionDep,
    SettingsDep,
    in_session,
)
from service.errors import (
    BlkpilotError,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unprocessable,
    responses,
)
from service.ops import metrics
from service.telemetry import service
from service.telemetry.schemas import TelemetryHourRead, TelemetryWindowRead

# in the ASGI scope: the event loop's statement was tried on this push and did not take it
# (service.telemetry.fastpath), so the route takes it in a unit of work, not trying again
EVENT_LOOP_TRIED = "blkpilot.push_tried_on_event_loop"

router = APIRouter(prefix=f"{API_PREFIX}", tags=["telemetry"], route_class=AuthFirstRoute)


@router.post(
    "/telemetry/batches",
    status_code=status.HTTP_201_CREATED,
    response_model=TelemetryBatchReceipt,
    responses={
        200: {"description": "this batch id was ingested before; nothing stored again"},
        **responses(Unauthorized, Forbidden, Conflict, PayloadTooLarge, Unprocessable),
    },
    openapi_extra=request_schema(TelemetryBatch),
)
async def ingest_batch(
    body: Annotated[tuple[Any, Any], Depends(fast_json_body(service.BATCHES, checked=True))],
    request: Request,
    node: CurrentNode,
    response: Response,
    settings: SettingsDep,
) -> TelemetryBatchReceipt:
    """Windows from the calling node's devices, stored whole or not at all."""
    try:
        batch, checked = body
        receipt = None
        pushes = request.app.state.database.pushes
        # a test's session override (its transaction, rolled back) is honoured: no own path
        tried = request.scope.get(EVENT_LOOP_TRIED, False)
        if pushes is not None and not tried and get_session not in request.app.dependency_overrides:
            receipt = await service.ingest_pushed(pushes, node, batch, settings.retention, checked)
        if receipt is None:
            metrics.TELEMETRY_PUSH_PATH.labels(path="unit_of_work").inc()
            receipt = await in_session(
                request, service.ingest, node, batch, settings.retention, checked
            )
    except BlkpilotError:
        metrics.TELEMETRY_BATCHES.labels(outcome="rejected").inc()
        raise
    if not receipt.accepted:
        response.status_code = status.HTTP_200_OK
    return receipt


@router.get(
    "/devices/{device_id}/telemetry",
    response_model=list[TelemetryWindowRead],
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def device_telemetry(
    device_id: uuid.UUID,
    session: SessionDep,
    principal: AnyPrincipal,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1_000,
) -> list[TelemetryWindowRead]:
    """Newest first."""
    windows = service.windows_for_device(
        session, principal, device_id, since=since, until=until, limit=limit
    )
    return [TelemetryWindowRead.model_validate(window) for window in windows]


@router.get(
    "/devices/{device_id}/telemetry/hourly",
    response_model=list[TelemetryHourRead],
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def device_telemetry_hourly(
    device_id: uuid.UUID,
    session: SessionDep,
    principal: AnyPrincipal,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[TelemetryHourRead]:
    """Oldest first: the device's hours rolled up from its windows, kept past the raw
    retention (default: the last 30 days)."""
    start = since or datetime.now(UTC) - timedelta(days=30)
    hours = service.hours_for_device(session, principal, device_id, since=start, until=until)
    return [TelemetryHourRead.model_validate(hour) for hour in hours]
