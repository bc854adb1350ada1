"""ASGI middleware: each request observed (id, access log, metrics), a cap on body size."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.contract.logs import (
    REQUEST_ID_HEADER,
    accepted_request_id,
    new_request_id,
    request_id,
)
from service.errors import BlkpilotError, PayloadTooLarge
from service.ops import metrics

log = logging.getLogger("blkpilot.access")
_HEADER = REQUEST_ID_HEADER.lower().encode()


class _BodyTooLarge(Exception):
    pass


class RequestObservationMiddleware:
    """Each request observed once: its id (the caller's X-Request-ID when well formed, else a
    new one), set for every log line written while it is handled and returned in the
    response; then its outcome, as one access-log line and as the request metrics (requests
    by method, route template and status; duration)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == _HEADER), None)
        rid = accepted_request_id(given) or new_request_id()
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (_HEADER, rid.encode())],
                }
            await send(message)

        failed = False
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # logged here, with the id; Starlette's outermost handler then answers 500 and
            # names the id (the variable is left set for it)
            failed = True
            log.exception("unhandled error in %s %s", scope["method"], scope["path"])
            raise
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            seconds = time.perf_counter() - started
            method = scope["method"]
            metrics.HTTP_REQUESTS.labels(method=method, route=route, status=str(status)).inc()
            metrics.HTTP_DURATION.labels(method=method, route=route).observe(seconds)
            log.info(
                "%s %s %d",
                scope["method"],
                scope["path"],
                status,
                extra={
                    "method": scope["method"],
                    "route": route,
                    "status": status,
                    "duration_ms": round(1000 * seconds, 2),
                },
            )
            if not failed:
                request_id.reset(token)


class ConnectionAdmissionMiddleware:
    """At most `limit` requests inside the application at once: as many as the database pool
    has connections, since each request holds one. The others wait here, on the event loop.

    Without it, requests beyond the pool wait for a connection inside AnyIO's worker threads;
    once they hold every thread, the requests that do have connections cannot get a thread to
    finish on, and nothing moves until the pool's 30 s timeout fails them all with 500 (found
    by bench/fleet.py's 64 concurrent enrollments against a pool of 20)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.slots = asyncio.Semaphore(limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        async with self.slots:
            await self.app(scope, receive, send)


class SelfOnlyDocsMiddleware:
    """/docs and /redoc may load nothing from another host (a Content-Security-Policy): the
    service serves its own Swagger UI and ReDoc, and ReDoc's footer still asks a CDN for a
    logo — on a machine without internet that request would hang until it timed out."""

    PATHS = frozenset({"/docs", "/redoc"})
    POLICY = (
        b"default-src 'self'; script-src 'self' 'unsafe-inline'; "
        b"style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        b"worker-src 'self' blob:; connect-src 'self'"
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.PATHS:
            await self.app(scope, receive, send)
            return

        async def with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"content-security-policy", self.POLICY))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_policy)


BODY_TOO_LARGE = "blkpilot.body_too_large"  # in the ASGI scope: the limit a body passed


class BodySizeLimitMiddleware:
    """Refuse bodies over the limit with 413, whether or not Content-Length is given."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._refuse(send)
                return
        received = 0
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI turns an error while it reads the body into its own 400: the
                    # mark tells the error handler it was this (a chunked body, no length)
                    scope[BODY_TOO_LARGE] = self.max_bytes
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not response_started:
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        await send_error(send, PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes"))


async def send_error(
    send: Send, error: BlkpilotError, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """An error answered by middleware, before any endpoint, in the one error shape."""
    body = json.dumps(error.body().model_dump()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status_code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
