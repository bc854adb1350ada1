"""Collectors: one per file, registered by name. Each is timed and isolated — one failing
collector never stops the others (as node_exporter's collectors are)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Collector(Protocol):
    name: str

    def collect(self, now: float) -> Any: ...


@dataclass
class CollectorStatus:
    seconds: float = 0.0
    ok: bool = True
    error: str = ""
    failures: int = 0


@dataclass
class CollectorSet:
    collectors: list[Collector]
    status: dict[str, CollectorStatus] = field(default_factory=dict)

    def collect(self, now: float) -> dict[str, Any]:
        """Each collector's result by name; a collector that raised is simply absent."""
        results: dict[str, Any] = {}
        for collector in self.collectors:
            status = self.status.setdefault(collector.name, CollectorStatus())
            started = time.perf_counter()
            try:
                results[collector.name] = collector.collect(now)
                status.ok, status.error = True, ""
            except Exception as error:  # isolation is the point: log, count, carry on
                status.ok, status.error = False, f"{type(error).__name__}: {error}"
                status.failures += 1
                log.warning("collector %s failed: %s", collector.name, status.error)
            status.seconds = time.perf_counter() - started
        return results


REGISTRY: dict[str, Callable[..., Collector]] = {}


def register(name: str) -> Callable[[Callable[..., Collector]], Callable[..., Collector]]:
    def add(factory: Callable[..., Collector]) -> Callable[..., Collector]:
        REGISTRY[name] = factory
        return factory

    return add
