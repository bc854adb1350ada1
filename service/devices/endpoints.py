from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from agent.contract.wire import DeviceClass, InventoryReport
from service.bodies import fast_json_body, json_response, request_schema
from service.deps import (
    API_PREFIX,
    MAX_OFFSET,
    AnyPrincipal,
    AuthFirstRoute,
    CurrentNode,
    SessionDep,
    ViewerAuth,
    in_session,
)
from service.devices import service
from service.devices.schemas import DeviceRead, InventoryReceipt
from service.errors import Forbidden, NotFound, Unauthorized, Unprocessable, responses

NEXT_CURSOR = "X-Next-Cursor"
router = APIRouter(prefix=f"{API_PREFIX}", tags=["devices"], route_class=AuthFirstRoute)


@router.put(
    "/nodes/{node_id}/inventory",
    response_model=InventoryReceipt,
    responses=responses(Unauthorized, Forbidden, NotFound, Unprocessable),
    openapi_extra=request_schema(InventoryReport),
)
async def put_inventory(
    node_id: uuid.UUID,
    body: Annotated[Any, Depends(fast_json_body(service.INVENTORIES))],
    request: Request,
    node: CurrentNode,
) -> Response:
    """The node's whole device list; devices missing from it are marked not present."""
    devices, added, updated, gone = await in_session(
        request, service.replace_inventory, node, node_id, body
    )
    receipt = InventoryReceipt(
        devices=devices,
        added=added,
        updated=updated,
        gone=gone,
    )
    return json_response(receipt)


@router.get(
    "/nodes/{node_id}/devices",
    response_model=list[DeviceRead],
    responses=responses(Unauthorized, Forbidden),
)
def node_devices(
    node_id: uuid.UUID, session: SessionDep, principal: AnyPrincipal
) -> list[DeviceRead]:
    """A node's devices; its agent may read its own."""
    devices = service.devices_of_node(session, principal, node_id)
    return [DeviceRead.model_validate(device) for device in devices]


@router.get(
    "/devices",
    response_model=list[DeviceRead],
    responses=responses(Unauthorized, Forbidden, Unprocessable),
)
def list_devices(
    session: SessionDep,
    _: ViewerAuth,
    response: Response,
    node_id: uuid.UUID | None = None,
    device_class: DeviceClass | None = None,
    present: bool | None = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    cursor: Annotated[
        str | None,
        Query(max_length=400, description="X-Next-Cursor of the previous page"),
    ] = None,
) -> list[DeviceRead]:
    """By node and name. A page that is not the last names the next in the X-Next-Cursor
    header: pass it as `cursor` (as fast on the last page of a fleet as on the first)."""
    devices, next_cursor = service.list_devices(
        session,
        node_id=node_id,
        device_class=device_class,
        present=present,
        limit=limit,
        offset=offset,
        cursor=cursor,
    )
    if next_cursor is not None:
        response.headers[NEXT_CURSOR] = next_cursor
    return [DeviceRead.model_validate(device) for device in devices]


@router.get(
    "/devices/{device_id}",
    response_model=DeviceRead,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_device(device_id: uuid.UUID, session: SessionDep, principal: AnyPrincipal) -> DeviceRead:
    return DeviceRead.model_validate(service.get_device(session, principal, device_id))
