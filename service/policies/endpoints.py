from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from agent.contract.base import SafeText
from agent.contract.wire import AppliedStateReport
from service.deps import (
    API_PREFIX,
    AnyPrincipal,
    AuthFirstRoute,
    CurrentNode,
    OperatorAuth,
    SessionDep,
)
from service.errors import Conflict, Forbidden, NotFound, Unauthorized, Unprocessable, responses
from service.policies import service
from service.policies.schemas import PolicyRead, PolicyRevert, PolicySet

router = APIRouter(prefix=f"{API_PREFIX}", tags=["policies"], route_class=AuthFirstRoute)


@router.put(
    "/devices/{device_id}/policy",
    response_model=PolicyRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Unprocessable),
)
def set_policy(
    device_id: uuid.UUID, body: PolicySet, session: SessionDep, operator: OperatorAuth
) -> PolicyRead:
    """Set the device's desired configuration; refused if the device cannot take it."""
    return service.set_policy(
        session, operator, device_id, body.config, body.reason, owners=body.owners
    )


@router.get(
    "/devices/{device_id}/policy",
    response_model=PolicyRead,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def get_policy(device_id: uuid.UUID, session: SessionDep, principal: AnyPrincipal) -> PolicyRead:
    return service.get_policy(session, principal, device_id)


@router.post(
    "/devices/{device_id}/policy/revert",
    response_model=PolicyRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict, Unprocessable),
)
def revert_policy(
    device_id: uuid.UUID, body: PolicyRevert, session: SessionDep, operator: OperatorAuth
) -> PolicyRead:
    """Back to the configuration before the current policy version (the previous version's,
    or what the device ran before its first): a new version, audited."""
    return service.revert_policy(session, operator, device_id, body.reason)


@router.delete(
    "/devices/{device_id}/policy",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def clear_policy(
    device_id: uuid.UUID,
    session: SessionDep,
    operator: OperatorAuth,
    reason: Annotated[SafeText, Query(min_length=3)],
) -> Response:
    service.clear_policy(session, operator, device_id, reason)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/nodes/{node_id}/policies",
    response_model=list[PolicyRead],
    responses=responses(Unauthorized, Forbidden),
)
def node_policies(
    node_id: uuid.UUID, session: SessionDep, principal: AnyPrincipal
) -> list[PolicyRead]:
    """What the node's agent should apply: one policy per device that has one."""
    return list(service.policies_for_node(session, principal, node_id))


@router.post(
    "/devices/{device_id}/applied-state",
    response_model=PolicyRead,
    responses=responses(Unauthorized, Forbidden, NotFound, Conflict),
)
def report_applied_state(
    device_id: uuid.UUID, body: AppliedStateReport, session: SessionDep, node: CurrentNode
) -> PolicyRead:
    """The agent reports what it applied (or failed to, rolled back, or found drifted)."""
    return service.report_applied(session, node, device_id, body)
