"""A request rate limit per caller, so that one misbehaving agent or script cannot starve the
others: each bearer token (by its digest; unauthenticated callers by address) has its own
budget (`limits`' sliding-window counters, in this process's memory). Over it: 429 with
Retry-After, in the one error shape, before any database work is done.

The counters live in each service process: with N processes behind a balancer a caller gets
up to N times the limit. Probes (/healthz, /readyz) and /metrics are not limited."""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from http.cookies import CookieError, SimpleCookie

from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import SlidingWindowCounterRateLimiter
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import TooManyRequests
from service.ops import metrics
from service.ops.middleware import send_error
from service.security import NODE_TOKEN_PREFIX, OPERATOR_TOKEN_PREFIX, SESSION_COOKIE

EXEMPT = frozenset({"/healthz", "/readyz", "/metrics"})


def parse_limits(text: str) -> list[RateLimitItem]:
    """`limits`' notation: "20/second;600/minute". Raises ValueError on anything else."""
    items = parse_many(text)
    if not items:
        raise ValueError(f"no rate limit in {text!r}")
    return items


def caller(scope: Scope) -> tuple[str, str]:
    """The key a request is counted under, and the kind of caller for the metric: the bearer
    token, else the dashboard's session cookie (which holds one), else the address."""
    token = ""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and given:
                token = given
                break
        if name == b"cookie" and not token:
            cookies = SimpleCookie()
            with contextlib.suppress(CookieError):
                cookies.load(value.decode("latin-1"))
            if SESSION_COOKIE in cookies:
                token = cookies[SESSION_COOKIE].value
    if token:
        kind = (
            "node"
            if token.startswith(NODE_TOKEN_PREFIX)
            else "operator"
            if token.startswith(OPERATOR_TOKEN_PREFIX)
            else "unknown"
        )
        return "token:" + hashlib.sha256(token.encode()).hexdigest(), kind
    client = scope.get("client")
    return f"address:{client[0] if client else '?'}", "anonymous"


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, limits_text: str) -> None:
        self.app = app
        self.items = parse_limits(limits_text)
        self.limiter = SlidingWindowCounterRateLimiter(MemoryStorage())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        key, kind = caller(scope)
        exceeded = [item for item in self.items if not self.limiter.hit(item, key)]
        if not exceeded:
            await self.app(scope, receive, send)
            return
        now = time.time()
        wait = max(self.limiter.get_window_stats(item, key).reset_time - now for item in exceeded)
        retry_after = max(1, math.ceil(wait))
        metrics.RATE_LIMITED.labels(caller=kind).inc()
        error = TooManyRequests(
            f"rate limit {'; '.join(str(i) for i in exceeded)} exceeded for this token;"
            f" retry after {retry_after} s"
        )
        await send_error(send, error, [(b"retry-after", str(retry_after).encode())])
