"""Dependencies injected into endpoints, as Annotated aliases."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.db import get_session
from service.errors import Forbidden, Unauthorized
from service.nodes import repository as node_repository
from service.nodes import tokens as node_tokens
from service.security import (
    NODE_TOKEN_PREFIX,
    OPERATOR_TOKEN_PREFIX,
    Principal,
    Role,
    token_digest,
)
from service.settings import Settings
from service.tokens import repository as token_repository

API_PREFIX = "/api/v1"
# Deeper pages are a sign of a missing filter, and offsets must fit PostgreSQL's BIGINT.
MAX_OFFSET = 1_000_000

SessionDep = Annotated[Session, Depends(get_session, scope="function")]

_bearer = HTTPBearer(auto_error=False, description="An operator API token or a node token")


def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def authenticate(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    principal, refused = identify(session, credentials.credentials)
    if principal is None:
        raise Unauthorized(refused)
    return principal


def principal_for_token(session: Session, token: str) -> Principal | None:
    """Who a token is (an operator's API token or a node's), or None if it is refused."""
    return identify(session, token)[0]


def identify(session: Session, token: str) -> tuple[Principal | None, str]:
    """Who a token is, or None and why it is refused."""
    digest = token_digest(token)
    if token.startswith(OPERATOR_TOKEN_PREFIX):
        api_token = token_repository.get_active_api_token_by_digest(session, digest)
        if api_token is not None:
            return Principal(name=f"token:{api_token.name}", role=Role(api_token.role)), ""
    elif token.startswith(NODE_TOKEN_PREFIX):
        node = node_repository.get_by_token_digest(session, digest)
        if node is not None:
            refused = node_tokens.refusal(node, digest, datetime.now(UTC))
            if refused is not None:
                return None, refused
            name = f"node:{node.hostname}/{str(node.id)[:8]}"
            return Principal(name=name, node_id=node.id, token_digest=digest), ""
    return None, "unknown or revoked token"


AnyPrincipal = Annotated[Principal, Depends(authenticate)]


def _require(role: Role) -> Callable[[Principal], Principal]:
    def check(principal: AnyPrincipal) -> Principal:
        if principal.is_node:
            raise Forbidden(f"node tokens cannot do this; it needs an operator token ({role})")
        if not principal.can(role):
            raise Forbidden(f"this needs the {role} role; the token has {principal.role}")
        return principal

    return check


def _require_node(principal: AnyPrincipal) -> Principal:
    if not principal.is_node:
        raise Forbidden("only a node's agent may do this, with its node token")
    return principal


ViewerAuth = Annotated[Principal, Depends(_require(Role.VIEWER))]
OperatorAuth = Annotated[Principal, Depends(_require(Role.OPERATOR))]
AdminAuth = Annotated[Principal, Depends(_require(Role.ADMIN))]
CurrentNode = Annotated[Principal, Depends(_require_node)]
