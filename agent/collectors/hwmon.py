"""hwmon power sensors: the ACPI power meter (whole system) reports microwatts."""

from __future__ import annotations

from pathlib import Path

from agent.collectors import register
from agent.config import AgentConfig
from agent.contract.wire import PowerScope
from agent.host import HostPaths, read_int, read_text
from agent.power import PowerSample

SYSTEM_METERS = {"power_meter"}  # ACPI000D: the platform's own meter of the whole system


class HwmonCollector:
    name = "hwmon"

    def __init__(self, paths: HostPaths) -> None:
        self.sensors: list[tuple[str, Path]] = []
        for hwmon in sorted((paths.sys / "class" / "hwmon").glob("hwmon*")):
            if (read_text(hwmon / "name") or "") not in SYSTEM_METERS:
                continue
            for pattern in ("power*_input", "power*_average"):
                for sensor in sorted(hwmon.glob(pattern)):
                    self.sensors.append((f"{hwmon.name}/{sensor.name}", sensor))

    def collect(self, now: float) -> list[PowerSample]:
        samples = []
        for zone, path in self.sensors:
            microwatts = read_int(path)
            if microwatts is not None and microwatts >= 0:
                samples.append(
                    PowerSample("hwmon", zone, PowerScope.SYSTEM, now, watts=microwatts / 1e6)
                )
        return samples


@register("hwmon", power=True)
def _from_config(config: AgentConfig) -> HwmonCollector | None:
    if not config.power.hwmon:
        return None
    hwmon = HwmonCollector(config.paths)
    return hwmon if hwmon.sensors else None
