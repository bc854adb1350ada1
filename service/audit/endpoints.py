from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from agent.contract.base import INT64_MAX, SafeText
from service.audit import service
from service.audit.schemas import AuditEventRead
from service.deps import API_PREFIX, AuthFirstRoute, SessionDep, ViewerAuth
from service.errors import Forbidden, Unauthorized, responses

router = APIRouter(prefix=f"{API_PREFIX}/audit", tags=["audit"], route_class=AuthFirstRoute)


@router.get("", response_model=list[AuditEventRead], responses=responses(Unauthorized, Forbidden))
def list_audit_events(
    session: SessionDep,
    _: ViewerAuth,
    target_type: SafeText | None = None,
    target_id: SafeText | None = None,
    action: SafeText | None = None,
    actor: SafeText | None = None,
    before_id: Annotated[
        int | None, Query(ge=1, le=INT64_MAX, description="page backwards from this id")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
) -> list[AuditEventRead]:
    """Newest first."""
    events = service.list_events(
        session,
        target_type=target_type,
        target_id=target_id,
        action=action,
        actor=actor,
        before_id=before_id,
        limit=limit,
    )
    return [AuditEventRead.model_validate(event) for event in events]
