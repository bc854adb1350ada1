from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from agent.contract.base import nul_free_json
from agent.contract.wire import TelemetryBatch, TelemetryBatchReceipt
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
from service.ops.middleware import BODY_TOO_LARGE
from service.telemetry import service
from service.telemetry.schemas import TelemetryHourRead, TelemetryWindowRead

router = APIRouter(prefix=f"{API_PREFIX}", tags=["telemetry"], route_class=AuthFirstRoute)


async def _batch_body(request: Request) -> TelemetryBatch:
    """The batch, parsed and validated in one pass by pydantic's JSON parser (FastAPI's own
    body path parses with json.loads first: a third slower on 500-window batches). Errors
    read as FastAPI's would: 422 with each field under "body"; 413 over the size limit."""
    try:
        raw = await request.body()
    except Exception:
        limit = request.scope.get(BODY_TOO_LARGE)
        if limit is not None:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes") from None
        raise
    try:
        with nul_free_json(raw):
            return TelemetryBatch.model_validate_json(raw)
    except ValidationError as error:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in error.errors()]
        ) from None


# the body as OpenAPI documents it (the dependency reads it itself)
_BATCH_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/TelemetryBatch"}}
        },
    }
}


@router.post(
    "/telemetry/batches",
    status_code=status.HTTP_201_CREATED,
    response_model=TelemetryBatchReceipt,
    responses={
        200: {"description": "this batch id was ingested before; nothing stored again"},
        **responses(Unauthorized, Forbidden, Conflict, PayloadTooLarge, Unprocessable),
    },
    openapi_extra=_BATCH_SCHEMA,
)
async def ingest_batch(
    body: Annotated[TelemetryBatch, Depends(_batch_body)],
    request: Request,
    node: CurrentNode,
    response: Response,
    settings: SettingsDep,
) -> TelemetryBatchReceipt:
    """Windows from the calling node's devices, stored whole or not at all."""
    try:
        receipt = await in_session(request, service.ingest, node, body, settings.retention)
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
