"""Collectors: one per file, registered by name with a factory that builds it from the agent's
configuration (or declines: a power source that is absent or switched off). The registry
drives collection, as node_exporter's does: `collectors_for` builds every registered collector
that is present and not disabled (`disabled_collectors` in agent.toml). Each is timed and
isolated — one failing collector never stops the others."""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agent.config import AgentConfig

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

    def close(self) -> None:
        """Release what collectors hold (eBPF programs stay attached until then)."""
        for collector in self.collectors:
            close = getattr(collector, "close", None)
            if callable(close):
                close()

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


# the modules whose collectors register themselves, in the order they collect (blklat right
# after diskstats: their counts of one window are compared)
BUILTIN = (
    "diskstats",
    "blklat",
    "cpu",
    "rapl",
    "hwmon",
    "ipmi",
    "redfish",
    "meter",
    "estimate",
)


@dataclass(frozen=True)
class Registration:
    name: str
    factory: Callable[[AgentConfig], Collector | None]
    power: bool  # a power source (what the benchmarks' energy meter reads)


REGISTRY: dict[str, Registration] = {}


def register(
    name: str, *, power: bool = False
) -> Callable[
    [Callable[[AgentConfig], Collector | None]], Callable[[AgentConfig], Collector | None]
]:
    def add(
        factory: Callable[[AgentConfig], Collector | None],
    ) -> Callable[[AgentConfig], Collector | None]:
        if name in REGISTRY:
            raise ValueError(f"a collector named {name!r} is registered already")
        REGISTRY[name] = Registration(name, factory, power)
        return factory

    return add


def load_builtin() -> None:
    for module in BUILTIN:
        importlib.import_module(f"agent.collectors.{module}")


def collectors_for(config: AgentConfig, *, power_only: bool = False) -> list[Collector]:
    """Every registered collector that is present on this node and not disabled."""
    load_builtin()
    unknown = set(config.disabled_collectors) - set(REGISTRY)
    if unknown:
        raise ValueError(
            f"disabled_collectors names unknown collectors: {', '.join(sorted(unknown))}"
            f" (known: {', '.join(REGISTRY)})"
        )
    found = []
    order = {name: index for index, name in enumerate(BUILTIN)}
    for registration in sorted(REGISTRY.values(), key=lambda r: order.get(r.name, len(order))):
        if registration.name in config.disabled_collectors:
            continue
        if power_only and not registration.power:
            continue
        collector = registration.factory(config)
        if collector is not None:
            found.append(collector)
    return found


def is_power_source(collector: Collector) -> bool:
    registration = REGISTRY.get(collector.name)
    return registration is not None and registration.power
