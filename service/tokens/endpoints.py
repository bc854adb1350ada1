from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status

from service.bodies import json_body, json_response, request_schema
from service.deps import (
    API_PREFIX,
    AdminAuth,
    AuthFirstRoute,
    SessionDep,
    SettingsDep,
    in_session,
)
from service.errors import Conflict, Forbidden, NotFound, Unauthorized, Unprocessable, responses
from service.tokens import service
from service.tokens.schemas import (
    ApiTokenCreate,
    ApiTokenCreated,
    ApiTokenRead,
    ApiTokenRotate,
    EnrollmentTokenCreate,
    EnrollmentTokenCreated,
)

router = APIRouter(prefix=f"{API_PREFIX}", tags=["tokens"], route_class=AuthFirstRoute)


@router.post(
    "/api-tokens",
    status_code=status.HTTP_201_CREATED,
    response_model=ApiTokenCreated,
    responses=responses(Unauthorized, Forbidden, Conflict),
)
def create_api_token(
    body: ApiTokenCreate, session: SessionDep, admin: AdminAuth
) -> ApiTokenCreated:
    ttl = timedelta(hours=body.ttl_hours) if body.ttl_hours is not None else None
    token, secret = service.create_api_token(
        session, admin, name=body.name, role=body.role, ttl=ttl
    )
    return ApiTokenCreated.model_validate(
        {**ApiTokenRead.model_validate(token).model_dump(), "token": secret}
    )


@router.get(
    "/api-tokens", response_model=list[ApiTokenRead], responses=responses(Unauthorized, Forbidden)
)
def list_api_tokens(session: SessionDep, _: AdminAuth) -> list[ApiTokenRead]:
    return [ApiTokenRead.model_validate(token) for token in service.list_api_tokens(session)]


@router.post(
    "/api-tokens/{token_id}/rotate",
    response_model=ApiTokenCreated,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def rotate_api_token(
    token_id: uuid.UUID, body: ApiTokenRotate, session: SessionDep, admin: AdminAuth
) -> ApiTokenCreated:
    """A new secret for the token (same name and role), shown once; the old one stops
    working at once."""
    ttl = timedelta(hours=body.ttl_hours) if body.ttl_hours is not None else None
    token, secret = service.rotate_api_token_by_id(session, admin, token_id, ttl=ttl)
    return ApiTokenCreated.model_validate(
        {**ApiTokenRead.model_validate(token).model_dump(), "token": secret}
    )


@router.delete(
    "/api-tokens/{token_id}",
    response_model=ApiTokenRead,
    responses=responses(Unauthorized, Forbidden, NotFound),
)
def revoke_api_token(token_id: uuid.UUID, session: SessionDep, admin: AdminAuth) -> ApiTokenRead:
    return ApiTokenRead.model_validate(service.revoke_api_token(session, admin, token_id))


@router.post(
    "/enrollment-tokens",
    status_code=status.HTTP_201_CREATED,
    response_model=EnrollmentTokenCreated,
    responses=responses(Unauthorized, Forbidden, Unprocessable),
    openapi_extra=request_schema(EnrollmentTokenCreate),
)
async def create_enrollment_token(
    body: Annotated[EnrollmentTokenCreate, Depends(json_body(EnrollmentTokenCreate))],
    request: Request,
    admin: AdminAuth,
    settings: SettingsDep,
) -> Response:
    """One per node a fleet rollout enrols: its unit of work in one hop to the thread pool."""
    ttl = timedelta(hours=body.ttl_hours or settings.enrollment_token_ttl_hours)
    token, secret = await in_session(
        request, service.create_enrollment_token, admin, labels=body.labels, ttl=ttl
    )
    created = EnrollmentTokenCreated(
        id=token.id, token=secret, labels=dict(token.labels), expires_at=token.expires_at
    )
    return json_response(created, status.HTTP_201_CREATED)
