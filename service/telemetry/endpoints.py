from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from agent.contract.wire import TelemetryBatch, TelemetryBatchReceipt
from service.deps import API_PREFIX, AnyPrincipal, CurrentNode, SessionDep, SettingsDep
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
from service.telemetry.schemas import TelemetryWindowRead

router = APIRouter(prefix=f"{API_PREFIX}", tags=["telemetry"])


@router.post(
    "/telemetry/batches",
    status_code=status.HTTP_201_CREATED,
    response_model=TelemetryBatchReceipt,
    responses={
        200: {"description": "this batch id was ingested before; nothing stored again"},
        **responses(Unauthorized, Forbidden, Conflict, PayloadTooLarge, Unprocessable),
    },
)
def ingest_batch(
    body: TelemetryBatch,
    session: SessionDep,
    node: CurrentNode,
    response: Response,
    settings: SettingsDep,
) -> TelemetryBatchReceipt:
    """Windows from the calling node's devices, stored whole or not at all."""
    try:
        receipt = service.ingest(session, node, body, settings.retention)
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
