from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from agent.contract.base import SafeText
from agent.contract.wire import EnrollRequest, Heartbeat
from service.deps import API_PREFIX, MAX_OFFSET, AnyPrincipal, CurrentNode, SessionDep, ViewerAuth
from service.errors import Forbidden, NotFound, Unauthorized, Unprocessable, responses
from service.nodes import service
from service.nodes.schemas import NodeEnrolled, NodeRead

router = APIRouter(prefix=f"{API_PREFIX}/nodes", tags=["nodes"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=NodeEnrolled,
    responses=responses(Unauthorized),
)
def enroll_node(body: EnrollRequest, session: SessionDep) -> NodeEnrolled:
    """Authenticated by the one-time enrollment token in the body; returns the node token."""
    node, secret = service.enroll(session, body)
    return NodeEnrolled(node=NodeRead.model_validate(node), node_token=secret)


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
