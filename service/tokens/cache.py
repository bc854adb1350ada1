"""Operators' API tokens this `serve` process has checked, kept so that an operator's request
(an enrollment token per node a rollout enrols) costs no lookup — kept **only while the
process hears every token change** (service.tokens.listener): a token rotated or revoked
through any replica or the CLI is then dropped here as soon as its commit is heard
(tests/test_replicas.py: within 5 s). While it does not hear (no listener, its connection
lost, a probe not heard back) nothing is kept: each request looks its token up, as before the cache.

A token is kept `TTL_S` at most — the resolution at which its last use is recorded (each miss
records it) — and never past its expiry.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

from service.security import Principal
from service.tokens.repository import LAST_USED_RESOLUTION

TTL_S = LAST_USED_RESOLUTION.total_seconds()


class ApiTokenCache:
    def __init__(self, ttl_s: float = TTL_S) -> None:
        self.ttl_s = ttl_s
        self._hearing = False
        self._kept: dict[str, tuple[Principal, datetime | None, float]] = {}
        self._lock = threading.Lock()
        self.generation = 0  # counts every clearing (as NodeCache's)

    def principal(self, digest: str, now: datetime) -> Principal | None:
        if not self._hearing:
            return None
        known = self._kept.get(digest)
        if known is None:
            return None
        principal, expires_at, cached_at = known
        if time.monotonic() - cached_at > self.ttl_s or (
            expires_at is not None and now >= expires_at
        ):
            self._kept.pop(digest, None)
            return None
        return principal

    def remember(
        self, digest: str, principal: Principal, expires_at: datetime | None, generation: int
    ) -> None:
        """Keeps it while hearing — unless `generation`, read before the lookup that found
        it, is past: a change heard meanwhile may be about this very token."""
        with self._lock:
            if self._hearing and generation == self.generation:
                self._kept[digest] = (principal, expires_at, time.monotonic())

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._kept.clear()

    @property
    def hearing(self) -> bool:
        return self._hearing

    def hear(self, hearing: bool) -> None:
        with self._lock:
            self.generation += 1
            self._kept.clear()
            self._hearing = hearing


API_TOKENS = ApiTokenCache()
