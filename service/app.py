"""The FastAPI application: routers under /api/v1, one error shape, metrics and limits."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
import psycopg
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from agent.contract import __version__
from agent.contract.logs import REQUEST_ID_HEADER, request_id
from service.audit.endpoints import router as audit_router
from service.bodies import SELF_READ
from service.dashboard.views import install as install_dashboard
from service.db import Database, push_connections
from service.devices.endpoints import router as devices_router
from service.errors import (
    BlkpilotError,
    ErrorBody,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    responses,
)
from service.nodes.endpoints import router as nodes_router
from service.observations.endpoints import router as observations_router
from service.ops import metrics
from service.ops.endpoints import router as ops_router
from service.ops.middleware import (
    BODY_TOO_LARGE,
    BodySizeLimitMiddleware,
    ConnectionAdmissionMiddleware,
    RequestObservationMiddleware,
    SelfOnlyDocsMiddleware,
)
from service.ops.ratelimit import RateLimitMiddleware
from service.policies.endpoints import router as policies_router
from service.recommendations.endpoints import router as recommendations_router
from service.rollouts.endpoints import router as rollouts_router
from service.settings import Settings
from service.telemetry.endpoints import router as telemetry_router
from service.telemetry.fastpath import PushFastPath
from service.tokens.endpoints import router as tokens_router

log = logging.getLogger(__name__)

# what the database driver raises while the database is away: connection refused or lost
# (OperationalError; psycopg's AdminShutdown and friends), a connection found closed
# (InterfaceError), no pooled connection within the pool's timeout (TimeoutError)
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)

_HTTP_ERRORS = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
}


def _error(status: int, body: ErrorBody) -> JSONResponse:
    return JSONResponse(body.model_dump(), status_code=status)


def _field(error: Any) -> dict[str, Any]:
    return {"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}


async def _blkpilot_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, BlkpilotError)
    return _error(error.status_code, error.body())


# how long a client should wait before trying again while the database is away: a restart
# takes seconds; the agent's client waits this out as it does a 429
DATABASE_RETRY_AFTER_S = 5


async def _database_unavailable(_: Request, error: Exception) -> JSONResponse:
    """The database went away (a restart, a crash, every connection busy past the pool's
    timeout): 503 with Retry-After, as /readyz says, never a 500 that drops the connection."""
    log.warning("database unavailable: %s", str(error).splitlines()[0] if str(error) else error)
    unavailable = ServiceUnavailable(
        "the database cannot be reached just now; nothing was changed by this request:"
        " try again after Retry-After seconds"
    )
    response = _error(unavailable.status_code, unavailable.body())
    response.headers["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    return response


async def _validation_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    fields = [_field(e) for e in error.errors()]
    shown = "; ".join(f"{'.'.join(str(p) for p in f['loc'])}: {f['msg']}" for f in fields[:10])
    more = f" (and {len(fields) - 10} more)" if len(fields) > 10 else ""
    return _error(422, ErrorBody(error="validation_error", detail=shown + more, fields=fields))


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    """Every method served at this path (Starlette names only the first route's)."""
    allowed = {
        method
        for method in _METHODS
        for route in request.app.router.routes
        if route.matches({**request.scope, "method": method})[0] is Match.FULL
    }
    return ", ".join(sorted(allowed))


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    limit = request.scope.get(BODY_TOO_LARGE)
    if limit is not None:  # the body was cut off at the limit while FastAPI read it
        return _error(413, PayloadTooLarge(f"request body exceeds {limit} bytes").body())
    if error.status_code == 400:
        # FastAPI's "error parsing the body" (e.g. bytes that are not UTF-8): a bad payload,
        # reported like every other bad payload.
        return _error(
            422,
            ErrorBody(
                error="validation_error",
                detail=f"body: {error.detail}",
                fields=[{"loc": ["body"], "msg": str(error.detail), "type": "body_unparsable"}],
            ),
        )
    name = _HTTP_ERRORS.get(error.status_code, "http_error")
    response = _error(error.status_code, ErrorBody(error=name, detail=str(error.detail)))
    if error.headers:
        response.headers.update(error.headers)
    if error.status_code == 405:
        response.headers["Allow"] = _allowed_methods(request)
    return response


# nginx's "client closed request": the caller hung up before its request was read whole.
# Not a server error (no alert, no traceback); nobody reads the answer.
CLIENT_CLOSED = 499


async def _client_disconnected(request: Request, _: Exception) -> JSONResponse:
    log.info("client hung up before its request was read: %s %s", request.method, request.url.path)
    return _error(
        CLIENT_CLOSED,
        ErrorBody(error="client_closed_request", detail="the client closed the connection"),
    )


async def _unexpected_error(_: Request, error: Exception) -> JSONResponse:
    """The traceback was logged with the request's id (RequestIdMiddleware); the caller gets
    the id to quote."""
    rid = request_id.get()
    response = _error(
        500,
        ErrorBody(
            error="internal_error",
            detail=f"internal error; see the service log (request {rid})",
        ),
    )
    if rid:
        response.headers[REQUEST_ID_HEADER] = rid
    return response


# every string the service takes must be storable (agent.contract.base.reject_nul): no NUL and
# no lone surrogate. Said in the schema, so that a client generated from it agrees.
STORABLE_TEXT = r"^[^\u0000\ud800-\udfff]*$"
_CONSTRAINED = ("pattern", "enum", "const", "format")


def _storable_text(node: Any) -> None:
    """STORABLE_TEXT as the pattern of every free-text string in the document (one that no
    pattern, enumeration or format constrains already), and of free-text property names."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        if item.get("type") == "string" and not any(k in item for k in _CONSTRAINED):
            item["pattern"] = STORABLE_TEXT
        names = item.get("propertyNames")
        if isinstance(names, dict) and not any(k in names for k in _CONSTRAINED):
            names["pattern"] = STORABLE_TEXT
        stack.extend(v for k, v in item.items() if k != "propertyNames")


def _openapi_with_one_error_shape(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """FastAPI documents its own 422 body; ours is ErrorBody, like every other error."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        schemas["ErrorBody"] = ErrorBody.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        # bodies an endpoint reads itself (service.bodies, for speed), with their parts
        for model in SELF_READ:
            found = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(found.pop("$defs", {}))
            schemas[model.__name__] = found
        for methods in spec.get("paths", {}).values():
            for operation in methods.values():
                responses = operation.get("responses", {})
                if "422" in responses:
                    responses["422"] = {
                        "description": "Validation error: the fields name what was wrong",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ErrorBody"}
                            }
                        },
                    }
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        _storable_text(spec)
        app.openapi_schema = spec
        return spec

    return openapi


def _lifespan(settings: Settings, database: Database) -> Callable[[FastAPI], Any]:
    """Sync endpoints and dependencies run on AnyIO's thread pool (40 threads by default):
    at least as many threads as requests admitted at once (ConnectionAdmissionMiddleware).
    The telemetry push's connections on the event loop are open while the application runs
    (service.db.push_connections)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, _admitted(settings))
        async with push_connections(database, settings.db_pool_size):
            yield

    return lifespan


def _admitted(settings: Settings) -> int:
    return settings.db_pool_size + settings.db_max_overflow


def create_app(settings: Settings, database: Database) -> FastAPI:
    # /docs and /redoc from the service's own copies of Swagger UI and ReDoc (fastapi-offline):
    # FastAPI's default loads them from a CDN, and showed a blank page without internet
    app = FastAPIOffline(
        lifespan=_lifespan(settings, database),
        title="blkpilot",
        version=__version__,
        description="Control plane for tuning Linux block I/O across a fleet.",
        # any call can pass its caller's rate limit (service/ops/ratelimit.py), or find the
        # database away
        responses=responses(TooManyRequests, ServiceUnavailable),
    )
    app.state.settings = settings
    app.state.database = database
    metrics.DB_POOL.engine = database.engine
    metrics.FLEET.engine = database.engine

    for router in (
        tokens_router,
        nodes_router,
        devices_router,
        telemetry_router,
        observations_router,
        policies_router,
        recommendations_router,
        rollouts_router,
        audit_router,
        ops_router,
    ):
        app.include_router(router)

    install_dashboard(app)
    app.openapi = _openapi_with_one_error_shape(app)  # type: ignore[method-assign]
    app.add_exception_handler(BlkpilotError, _blkpilot_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for unavailable in DATABASE_UNAVAILABLE:
        app.add_exception_handler(unavailable, _database_unavailable)
    app.add_exception_handler(ClientDisconnect, _client_disconnected)
    app.add_exception_handler(Exception, _unexpected_error)
    # innermost: the fleet's pushes answered without the router where the route would answer
    # them so (service.telemetry.fastpath), inside every middleware below
    app.add_middleware(PushFastPath, fastapi=app)
    # Outermost last: every request is observed (its id on every line logged inside, the
    # access log, the metrics), including those refused for their size.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_request_bytes)
    # inside the observation: a 429 is logged and counted with its request id
    app.add_middleware(RateLimitMiddleware, limits_text=settings.rate_limit)
    # no more requests inside than the pool has connections (each holds one): the others
    # wait here, on the event loop, not in threads (ConnectionAdmissionMiddleware)
    app.add_middleware(ConnectionAdmissionMiddleware, limit=_admitted(settings))
    app.add_middleware(SelfOnlyDocsMiddleware)
    app.add_middleware(RequestObservationMiddleware)
    return app
