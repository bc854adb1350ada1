"""RAPL energy counters under /sys/class/powercap (intel-rapl, also used by AMD).

energy_uj wraps at max_energy_range_uj; the collector keeps its own unwrapped total."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.collectors import register
from agent.config import AgentConfig
from agent.contract.wire import PowerScope
from agent.host import HostPaths, read_int, read_text
from agent.power import PowerSample


def scope_of(zone_name: str) -> PowerScope | None:
    if zone_name.startswith("package"):
        return PowerScope.CPU_PACKAGE
    if zone_name == "dram":
        return PowerScope.DRAM
    if zone_name == "psys":
        return PowerScope.SYSTEM
    return None  # core, uncore: inside a package already counted


def unwrap(previous_raw: int, raw: int, max_range: int) -> int:
    """Microjoules consumed between two readings of a counter that wraps at max_range."""
    return raw - previous_raw if raw >= previous_raw else raw + (max_range - previous_raw)


@dataclass
class _Zone:
    path: Path
    name: str
    scope: PowerScope
    max_range: int
    raw: int | None = None
    total_uj: int = 0


class RaplCollector:
    name = "rapl"

    def __init__(self, paths: HostPaths) -> None:
        self.zones: list[_Zone] = []
        for path in sorted((paths.sys / "class" / "powercap").glob("intel-rapl:*")):
            zone_name = read_text(path / "name") or ""
            scope = scope_of(zone_name)
            max_range = read_int(path / "max_energy_range_uj")
            if scope is not None and max_range and (path / "energy_uj").exists():
                # package-N names repeat across sockets only with their index: keep them apart
                self.zones.append(_Zone(path, zone_name, scope, max_range))

    def collect(self, now: float) -> list[PowerSample]:
        samples = []
        for zone in self.zones:
            raw = read_int(zone.path / "energy_uj")
            if raw is None:
                continue  # unreadable (permissions, or the zone went away): no number at all
            if zone.raw is not None:
                zone.total_uj += unwrap(zone.raw, raw, zone.max_range)
            zone.raw = raw
            samples.append(
                PowerSample(
                    "rapl",
                    f"{zone.path.name}/{zone.name}",
                    zone.scope,
                    now,
                    energy_joules=zone.total_uj / 1e6,
                )
            )
        return samples


@register("rapl", power=True)
def _from_config(config: AgentConfig) -> RaplCollector | None:
    if not config.power.rapl:
        return None
    rapl = RaplCollector(config.paths)
    return rapl if rapl.zones else None
