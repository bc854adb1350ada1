"""A request rate limit per caller, so that one misbehaving agent or script cannot starve the
others: each bearer token (by its digest; unauthenticated callers by address) has its own
budget (sliding-window counters, in this process's memory: SlidingWindowCounters). Over it:
429 with Retry-After, in the one error shape, before any database work is done.

The counters live in each service process: with N processes behind a balancer a caller gets
up to N times the limit. Probes (/healthz, /readyz) and /metrics are not limited."""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie

from limits import RateLimitItem, parse_many
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


@dataclass
class _Window:
    index: int  # the current window's number (monotonic seconds // the item's length)
    current: int = 0  # hits counted in it
    previous: int = 0  # hits counted in the one before


@dataclass
class SlidingWindowCounters:
    """`limits`' sliding-window counter, kept for the event loop: per limit and caller, the hits
    counted in the current fixed window and in the one before; a hit is counted while the
    previous window's hits, weighted by the share of that window the sliding one still
    covers, plus the current window's, stay under the limit (limits'
    SlidingWindowCounterRateLimiter, the same arithmetic). A hit costs a dict lookup; the
    callers not heard from for two windows are forgotten in one pass per longest window.

    Not limits' MemoryStorage: on a hit it started a timer thread (10 ms) whenever the last
    one had fired — under load, on every request. `Thread.start` held the event loop until the
    new thread ran: 9.5 % of serve's main thread in `python -m bench.ingest` (py-spy with
    idle samples, 2026-11-29). And each timer walked every counter (two per caller and limit:
    40,000 at 10,000 nodes) a hundred times a second."""

    items: list[RateLimitItem]
    _windows: dict[tuple[int, str], _Window] = field(default_factory=dict)
    _forget_at: float = 0.0

    def hit(self, key: str, now: float | None = None) -> list[tuple[RateLimitItem, float]]:
        """Counts a hit for `key` (monotonic seconds `now`) under each limit it fits in, and
        returns the limits it exceeded, each with the seconds until a hit would fit in it."""
        now = time.monotonic() if now is None else now
        if now >= self._forget_at:
            self._forget(now)
        exceeded = []
        for number, item in enumerate(self.items):
            length = item.get_expiry()
            index = int(now // length)
            window = self._windows.get((number, key))
            if window is None:
                window = self._windows[(number, key)] = _Window(index)
            elif window.index != index:
                adjacent = window.index == index - 1
                window.previous = window.current if adjacent else 0
                window.current, window.index = 0, index
            elapsed = now - index * length
            weighted = window.previous * (1 - elapsed / length) + window.current
            if math.floor(weighted) + 1 > item.amount:
                exceeded.append((item, self._wait(window, item, elapsed)))
            else:
                window.current += 1
        return exceeded

    @staticmethod
    def _wait(window: _Window, item: RateLimitItem, elapsed: float) -> float:
        """Seconds until one more hit fits: within this window, once the previous window's
        weight has fallen far enough; else into the next, where this one's hits weigh."""
        length, amount = item.get_expiry(), item.amount
        if window.current < amount:
            # previous * (1 - (elapsed + t) / length) + current < amount
            return max(0.0, length * (1 - (amount - window.current) / window.previous) - elapsed)
        return length - elapsed + length * (1 - amount / window.current)

    def _forget(self, now: float) -> None:
        for (number, key), window in list(self._windows.items()):
            if window.index < int(now // self.items[number].get_expiry()) - 1:
                del self._windows[(number, key)]
        self._forget_at = now + max(item.get_expiry() for item in self.items)

    def __len__(self) -> int:
        """Counters held: one per limit and caller heard from within two of its windows."""
        return len(self._windows)


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, limits_text: str) -> None:
        self.app = app
        self.counters = SlidingWindowCounters(parse_limits(limits_text))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        key, kind = caller(scope)
        exceeded = self.counters.hit(key)
        if not exceeded:
            await self.app(scope, receive, send)
            return
        retry_after = max(1, math.ceil(max(wait for _, wait in exceeded)))
        metrics.RATE_LIMITED.labels(caller=kind).inc()
        error = TooManyRequests(
            f"rate limit {'; '.join(str(i) for i, _ in exceeded)} exceeded for this token;"
            f" retry after {retry_after} s"
        )
        await send_error(send, error, [(b"retry-after", str(retry_after).encode())])
