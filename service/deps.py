"""Dependencies injected into endpoints, as Annotated aliases."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.db import get_session
from service.errors import Forbidden, Unauthorized, UnsupportedMediaType
from service.nodes import repository as node_repository
from service.nodes import tokens as node_tokens
from service.nodes.cache import NODES
from service.security import (
    NODE_TOKEN_PREFIX,
    OPERATOR_TOKEN_PREFIX,
    Principal,
    Role,
    token_digest,
)
from service.settings import Settings
from service.tokens import repository as token_repository
from service.tokens.cache import API_TOKENS

T = TypeVar("T")

API_PREFIX = "/api/v1"
# Deeper pages are a sign of a missing filter, and offsets must fit PostgreSQL's BIGINT.
MAX_OFFSET = 1_000_000

SessionDep = Annotated[Session, Depends(get_session, scope="function")]

_bearer = HTTPBearer(auto_error=False, description="An operator API token or a node token")


async def get_settings_dep(request: Request) -> Settings:
    """async, as every dependency here that does no I/O: FastAPI runs a plain `def`
    dependency in its thread pool, a hop (futex wake-ups, context switches) that cost more
    than the work — six of them on a telemetry push (bench/results/ingest.md)."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


# in the ASGI scope: who the request's token is, found before its body was read (AuthFirstRoute)
PRINCIPAL = "blkpilot.principal"


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """Who calls: found before the body by AuthFirstRoute, or a node token checked in the last
    few seconds (no session, no thread), else looked up in a unit of work of its own."""
    known: Principal | None = request.scope.get(PRINCIPAL)
    if known is not None:
        return known
    cached = cached_principal(credentials)
    if cached is not None:
        return cached
    return await in_session(request, _principal, credentials)


def _principal(session: Session, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    principal, refused = identify(session, credentials.credentials)
    if principal is None:
        raise Unauthorized(refused)
    return principal


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _calls(dependant: Dependant) -> list[Callable[..., Any]]:
    """Every dependency's callable, at any depth."""
    found = []
    for dependency in dependant.dependencies:
        if dependency.call is not None:
            found.append(dependency.call)
        found += _calls(dependency)
    return found


def is_json(content_type: str) -> bool:
    """JSON, in UTF-8: the only encoding JSON has (RFC 8259); a body declared in another
    charset is not read as if it were UTF-8."""
    media, _, parameters = content_type.partition(";")
    media = media.strip().lower()
    if not (
        media == "application/json"
        or (media.startswith("application/") and media.endswith("+json"))
    ):
        return False
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


class AuthFirstRoute(APIRoute):
    """A route that, for a request that may carry a body, checks the token and the
    Content-Type before the body is read: FastAPI reads and parses a body before it solves an
    endpoint's dependencies, so without this a caller with no token had a 15 MB body read and
    parsed (and invalid JSON answered 422) before its 401. The principal found is kept in the
    scope, so `authenticate` does not look it up again."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        calls = _calls(self.dependant)
        authenticated = authenticate in calls
        # the role checks (_require, _require_node): a viewer is refused before its body too
        authorizations = [call for call in calls if getattr(call, "authorizes", False)]
        takes_json = self.body_field is not None or "requestBody" in (self.openapi_extra or {})
        if not (authenticated or takes_json):
            return handler

        async def checked(request: Request) -> Response:
            if request.method in _BODY_METHODS:
                if authenticated:
                    credentials = await _bearer(request)
                    # in a unit of work of its own: the endpoint's comes later, with the
                    # dependencies
                    principal = cached_principal(credentials) or await in_session(
                        request, _principal, credentials
                    )
                    for authorize in authorizations:
                        await authorize(principal)
                    request.scope[PRINCIPAL] = principal
                if (
                    takes_json
                    and _has_body(request)
                    and not is_json(request.headers.get("content-type", ""))
                ):
                    raise UnsupportedMediaType(
                        "this endpoint takes JSON in UTF-8: send Content-Type:"
                        " application/json (with no charset, or charset=utf-8)"
                    )
            return await handler(request)

        return checked


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    if length is not None:
        return length.strip() != "0"
    return "transfer-encoding" in request.headers


def _in_session(request: Request, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """work(session, *args, **kwargs) in a unit of work of its own (get_session's: committed if it
    returns, rolled back if it raises); a test's session override is used here too."""
    provider = request.app.dependency_overrides.get(get_session, get_session)
    arguments = (request,) if inspect.signature(provider).parameters else ()
    with contextmanager(provider)(*arguments) as session:
        return work(session, *args, **kwargs)


async def in_session(request: Request, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """work(session, *args, **kwargs) in its own unit of work, in one hop to the thread pool
    — where a `def` endpoint with SessionDep takes three (the session opened, the endpoint,
    the commit): for the endpoints a fleet calls most (telemetry, enrolment, inventory)."""
    return await run_in_threadpool(_in_session, request, work, *args, **kwargs)


def principal_for_token(session: Session, token: str) -> Principal | None:
    """Who a token is (an operator's API token or a node's), or None if it is refused."""
    return identify(session, token)[0]


def identify(session: Session, token: str) -> tuple[Principal | None, str]:
    """Who a token is, or None and why it is refused."""
    digest = token_digest(token)
    if token.startswith(OPERATOR_TOKEN_PREFIX):
        known = API_TOKENS.principal(digest, datetime.now(UTC))
        if known is not None:
            return known, ""
        generation = API_TOKENS.generation
        api_token = token_repository.get_active_api_token_by_digest(session, digest)
        if api_token is not None:
            now = datetime.now(UTC)
            if api_token.expires_at is not None and api_token.expires_at <= now:
                return None, (
                    f"API token {api_token.name!r} expired at"
                    f" {api_token.expires_at:%Y-%m-%d %H:%M %Z}: rotate it"
                    f" (`blkpilot token rotate {api_token.name}`)"
                )
            token_repository.touch_api_token(session, api_token, now)
            principal = Principal(name=f"token:{api_token.name}", role=Role(api_token.role))
            API_TOKENS.remember(digest, principal, api_token.expires_at, generation)
            return principal, ""
    elif token.startswith(NODE_TOKEN_PREFIX):
        now = datetime.now(UTC)
        known = NODES.principal(digest, now)
        if known is not None:
            return known, ""
        generation = NODES.generation
        node = node_repository.get_by_token_digest(session, digest)
        if node is not None:
            refused = node_tokens.refusal(node, digest, now)
            if refused is not None:
                return None, refused
            principal = node_tokens.principal_of(node, digest)
            NODES.remember(digest, principal, node_tokens.good_until(node, digest), generation)
            return principal, ""
    return None, "unknown or revoked token"


def cached_principal(credentials: HTTPAuthorizationCredentials | None) -> Principal | None:
    """A token this process checked and keeps (a node's: service.nodes.cache; an operator's,
    while every change is heard: service.tokens.cache), found without a database session or a
    thread: most requests are nodes' pushes, and a rollout's enrolments an operator's calls."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        return None
    return _cached_principal(credentials.credentials)


def cached_principal_of_header(authorization: bytes | None) -> Principal | None:
    """cached_principal of an Authorization header's raw value, read as `_bearer` reads it
    (service.telemetry.fastpath, which has no Request)."""
    scheme, token = get_authorization_scheme_param(
        None if authorization is None else authorization.decode("latin-1")
    )
    if not (scheme and token) or scheme.lower() != "bearer":
        return None
    return _cached_principal(token)


def _cached_principal(token: str) -> Principal | None:
    if token.startswith(OPERATOR_TOKEN_PREFIX):
        return API_TOKENS.principal(token_digest(token), datetime.now(UTC))
    if not token.startswith(NODE_TOKEN_PREFIX):
        return None
    return NODES.principal(token_digest(token), datetime.now(UTC))


AnyPrincipal = Annotated[Principal, Depends(authenticate)]


def _require(role: Role) -> Callable[[Principal], Coroutine[Any, Any, Principal]]:
    async def check(principal: AnyPrincipal) -> Principal:
        if principal.is_node:
            raise Forbidden(f"node tokens cannot do this; it needs an operator token ({role})")
        if not principal.can(role):
            raise Forbidden(f"this needs the {role} role; the token has {principal.role}")
        return principal

    check.authorizes = True  # type: ignore[attr-defined]
    return check


async def _require_node(principal: AnyPrincipal) -> Principal:
    if not principal.is_node:
        raise Forbidden("only a node's agent may do this, with its node token")
    return principal


_require_node.authorizes = True  # type: ignore[attr-defined]


ViewerAuth = Annotated[Principal, Depends(_require(Role.VIEWER))]
OperatorAuth = Annotated[Principal, Depends(_require(Role.OPERATOR))]
AdminAuth = Annotated[Principal, Depends(_require(Role.ADMIN))]
CurrentNode = Annotated[Principal, Depends(_require_node)]
