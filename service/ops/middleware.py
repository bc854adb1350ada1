"""ASGI middleware: request metrics and a cap on request body size."""

from __future__ import annotations

import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import PayloadTooLarge
from service.ops import metrics


class _BodyTooLarge(Exception):
    pass


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            metrics.HTTP_REQUESTS.labels(method=method, route=template, status=str(status)).inc()
            metrics.HTTP_DURATION.labels(method=method, route=template).observe(
                time.perf_counter() - started
            )


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
        error = PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes")
        body = json.dumps(error.body().model_dump()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status_code,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
