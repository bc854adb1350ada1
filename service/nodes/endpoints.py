from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status

from agent.contract.base import SafeText
from agent.contract.wire import EnrollRequest, Heartbeat
from service.bodies import json_body, json_response, request_schema
from service.deps import (
    API_PREFIX,
    MAX_OFFSET,
    AdminAuth,
    AnyPrincipal,
    AuthFirstRoute,
    CurrentNode,
    SessionDep,
    SettingsDep,
    ViewerAuth,
    in_session,
)
from service.errors import Conflict, Forbidden, NotFound, Unauthorized, Unprocessable, responses
from service.nodes import service
from service.nodes.schemas import NodeEnrolled, NodeRead, NodeRevoke, NodeTokenIssued
from service.settings import token_lifetime

router = APIRouter(prefix=f"{API_PREFIX}/nodes", tags=["nodes"], route_class=AuthFirstRoute)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=NodeEnrolled,
    responses=responses(Unauthorized, Unprocessable),
    openapi_extra=request_schema(EnrollRequest),
)
async def enroll_node(
    body: Annotated[EnrollRequest, Depends(json_body(EnrollRequest))],
    request: Request,
    settings: SettingsDep,
) -> Response:
    """Authenticated by the one-time enrollment token in the body; returns the node token,
    with when it expires and when the agent should renew it."""
    lifetime = token_lifetime(settings)
    node, secret = await in_session(request, service.enroll, body, lifetime)
    enrolled = NodeEnrolled(
        node=NodeRead.model_validate(node),
        node_token=secret,
        expires_at=node.token_expires_at,
        renew_after=lifetime.renew_after(datetime.now(UTC)),
    )
    return json_response(enrolled, status.HTTP_201_CREATED)


@router.post(
    "/{node_id}/token",
    status_code=status.HTTP_201_CREATED,
    response_model=NodeTokenIssued,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def renew_node_token(
    node_id: uuid.UUID, session: SessionDep, node: CurrentNode, settings: SettingsDep
) -> NodeTokenIssued:
    """A node renews its own token before it expires. The token this call was made with
    stays good for the grace period (BLKPILOT_NODE_TOKEN_GRACE_SECONDS), then is refused."""
    lifetime = token_lifetime(settings)
    found, secret = service.renew_token(session, node, node_id, lifetime)
    return NodeTokenIssued(
        node_token=secret,
        expires_at=found.token_expires_at,
        renew_after=lifetime.renew_after(datetime.now(UTC)),
    )


@router.post(
    "/{node_id}/revoke",
    response_model=NodeRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def revoke_node(
    node_id: uuid.UUID, body: NodeRevoke, session: SessionDep, admin: AdminAuth
) -> NodeRead:
    """Refuse the node's tokens at once (a lost or compromised host). Its devices, telemetry,
    policies and audit history stay; to come back it enrolls again, as a new node."""
    return NodeRead.model_validate(service.revoke(session, admin, node_id, body.reason))


@router.get(
    "", response_model=list[NodeRead], responses=responses(Unauthorized, Forbidden, Unprocessable)
)
def list_nodes(
    session: SessionDep,
    _: ViewerAuth,
    hostname: SafeText | None = None,
    label: Annotated[SafeText | None, Query(description="key=value")] = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[NodeRead]:
    nodes = service.list_nodes(session, hostname=hostname, label=label, limit=limit, offset=offset)
    return [NodeRead.model_validate(node) for node in nodes]


@router.get(
    "/{node_id}", response_model=NodeRead, responses=responses(Unauthorized, Forbidden, NotFound)
)
def get_node(node_id: uuid.UUID, session: SessionDep, principal: AnyPrincipal) -> NodeRead:
    return NodeRead.model_validate(service.get_node(session, principal, node_id))


@router.post(
    "/{node_id}/heartbeat",
    response_model=NodeRead,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def heartbeat(
    node_id: uuid.UUID, body: Heartbeat, session: SessionDep, node: CurrentNode
) -> NodeRead:
    return NodeRead.model_validate(service.heartbeat(session, node, node_id, body))
