"""What a node token is and which devices its node has, kept in this `serve` process between
requests: a node pushes telemetry every 30 s, and looking both up in PostgreSQL was two of
each push's five round trips (issue 35).

- **Principals**, by token digest, never past the token's own expiry: a node revoked or
  renewed through this replica is dropped here at once (after the commit); through another
  replica, when this process hears of its commit (service.tokens.listener, PostgreSQL's
  LISTEN/NOTIFY; tests/test_replicas.py: within 5 s). While it hears every change a
  principal is kept `HEARD_TTL_S` — longer than the agent's 30 s between pushes, or every push
  would look its token up again (it did: bench.fleet, 10,000 nodes) — and while it does not
  (no listener, its connection lost and not yet back), `TTL_S`, so that a change it missed is
  refused within that. Operators' API tokens are kept apart, and only while every change is
  heard (service.tokens.cache).
- **Device ids by name**, per node: a node's devices are never deleted (a device that went
  away keeps its id and history), so a map read once stays true; a name it lacks is looked up
  again before a window naming it is refused (its inventory may have come since, through
  any replica).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from service.security import Principal

TTL_S = 10.0
HEARD_TTL_S = 600.0
MAX_ENTRIES = 100_000  # per map: beyond it the oldest half goes (a fleet is ~10k nodes)


@dataclass(frozen=True)
class _Known:
    principal: Principal
    valid_until: datetime  # the token's own expiry (or its grace's end)
    cached_at: float  # time.monotonic()


class NodeCache:
    def __init__(self, ttl_s: float = TTL_S, heard_ttl_s: float = HEARD_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.heard_ttl_s = heard_ttl_s
        self._hearing = False
        self._principals: dict[str, _Known] = {}
        self._devices: dict[uuid.UUID, dict[str, uuid.UUID]] = {}
        self._lock = threading.Lock()
        # counts every forgetting: a lookup that began before one must not keep what it found
        # (the change it missed may be the one forgotten)
        self.generation = 0

    def principal(self, digest: str, now: datetime) -> Principal | None:
        known = self._principals.get(digest)
        if known is None:
            return None
        ttl = self.heard_ttl_s if self._hearing else self.ttl_s
        if time.monotonic() - known.cached_at > ttl or now >= known.valid_until:
            self._principals.pop(digest, None)
            return None
        return known.principal

    def remember(
        self,
        digest: str,
        principal: Principal,
        valid_until: datetime,
        generation: int | None = None,
    ) -> None:
        """Keeps it — unless `generation` (read before the lookup that found it) is past."""
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            self._trim(self._principals)
            self._principals[digest] = _Known(principal, valid_until, time.monotonic())

    @property
    def hearing(self) -> bool:
        return self._hearing

    def hear(self, hearing: bool) -> None:
        """Whether every token change is heard from now on. Either way the principals kept so
        far go: a change made before listening began, or while it was lost, was not heard."""
        with self._lock:
            self.generation += 1
            self._principals.clear()
            self._hearing = hearing

    def devices(self, node_id: uuid.UUID) -> dict[str, uuid.UUID] | None:
        return self._devices.get(node_id)

    def remember_devices(self, node_id: uuid.UUID, ids: dict[str, uuid.UUID]) -> None:
        with self._lock:
            self._trim(self._devices)
            self._devices[node_id] = dict(ids)

    def forget_node(self, node_id: uuid.UUID) -> None:
        """Its principals and its device map: revoked, renewed or re-inventoried here."""
        with self._lock:
            self.generation += 1
            for digest in [
                d for d, k in self._principals.items() if k.principal.node_id == node_id
            ]:
                self._principals.pop(digest, None)
            self._devices.pop(node_id, None)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._principals.clear()
            self._devices.clear()

    @staticmethod
    def _trim(entries: dict[Any, Any]) -> None:
        if len(entries) >= MAX_ENTRIES:
            for key in list(entries)[: MAX_ENTRIES // 2]:  # dicts keep insertion order
                entries.pop(key, None)


NODES = NodeCache()
