"""The telemetry push a fleet sends all day, answered without FastAPI's routing and
dependencies — and every other push handed to the route, unchanged.

At 10,000 nodes a replica answers about 333 pushes a second, and for a 48-window push the
framework between the middleware and the endpoint was the largest part of `serve`'s CPU:
the router's match, the dependency solving, the route's wrappers and the response model's
second validation, and every await resumed through some twenty coroutine frames (py-spy,
bench/results/ingest.md). The work itself is the route's: the same token cache
(service.deps.cached_principal), decoder (service.telemetry.service.BATCHES) and storing
statement (service.telemetry.service.ingest_pushed).

`PushFastPath` answers a push only where the route would answer 201 by that same path: a
node token this process holds, a JSON body the decoder takes, a batch the event loop's
statement stores. Anything else — an unknown token, an operator's token, another media
type, a body the model must judge, a node's first push of a day, a batch id seen before, a
test's session override — is handed to the route with the body it read replayed, so every
refusal and its wording stay the route's (tests/service/test_ingest_statement.py). It sits
inside every middleware: the size limit, the rate limit, the admission and the observation
(request id, access log, metrics under the route's template) apply to it as to the route.
`blkpilot_telemetry_push_lean` counts the pushes it answered and those it handed on, by
reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.db import get_session
from service.deps import cached_principal_of_header, is_json
from service.ops import metrics
from service.telemetry import endpoints, service

# the push's route: its path is what this answers, its template what the observation labels
(ROUTE,) = (
    r
    for r in endpoints.router.routes
    if isinstance(r, APIRoute) and r.endpoint is endpoints.ingest_batch
)
_JSON = [(b"content-type", b"application/json")]


class PushFastPath:
    """ASGI middleware: POST /api/v1/telemetry/batches answered in place where it can be
    (see the module)."""

    def __init__(self, app: ASGIApp, fastapi: FastAPI) -> None:
        self.app = app
        self.fastapi = fastapi

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != ROUTE.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        reason, read = await self._answer(scope, receive, send)
        metrics.TELEMETRY_PUSH_LEAN.labels(outcome=reason or "answered").inc()
        if reason is None:
            return
        await self.app(scope, _replaying(read, receive) if read else receive, send)

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send
    ) -> tuple[str | None, list[Message]]:
        """(None, …) where it answered; else why not, and the messages it read of the body."""
        token = content_type = None
        for name, value in scope["headers"]:  # the first of each, as Starlette's Headers
            if name == b"authorization" and token is None:
                token = value
            elif name == b"content-type" and content_type is None:
                content_type = value
        principal = cached_principal_of_header(token)
        if principal is None or not principal.is_node:
            return "token_not_held", []
        if content_type is None or not is_json(content_type.decode("latin-1")):
            return "not_json", []
        state = self.fastapi.state
        pushes = state.database.pushes
        if pushes is None or get_session in self.fastapi.dependency_overrides:
            return "no_event_loop_path", []
        read: list[Message] = []
        chunks: list[bytes] = []
        while True:
            # the size limit's receive raises past its limit: its middleware answers 413
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                return "disconnected", read
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        found = service.BATCHES.decode_checked(b"".join(chunks))
        if found is None:
            return "model_judges", read
        batch, checked = found
        receipt = await service.ingest_pushed(
            pushes, principal, batch, state.settings.retention, checked
        )
        if receipt is None:
            scope[endpoints.EVENT_LOOP_TRIED] = True
            return "unit_of_work", read
        scope["route"] = ROUTE
        body = receipt.model_dump_json().encode()
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [*_JSON, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return None, read


def _replaying(read: list[Message], receive: Receive) -> Callable[[], Any]:
    """`receive` with the messages already read given first, in their order."""
    pending = list(read)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
