"""IPMI DCMI power reading from the BMC (`ipmitool dcmi power reading`): whole system.

A BMC answers slowly, so it is asked at most every `min_interval` seconds."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from agent.collectors import register
from agent.config import AgentConfig
from agent.contract.wire import PowerScope
from agent.effects import Effects
from agent.power import PowerSample

_READING = re.compile(r"Instantaneous power reading:\s*(\d+(?:\.\d+)?)\s*Watts", re.I)
_STATE = re.compile(r"Power reading state is:\s*(\w+)", re.I)


def parse_dcmi_power(text: str) -> float | None:
    """Watts, or None when the BMC says power readings are deactivated or gives none."""
    state = _STATE.search(text)
    if state and state.group(1).lower() != "activated":
        return None
    found = _READING.search(text)
    return float(found.group(1)) if found else None


def available(dev: Path) -> bool:
    return shutil.which("ipmitool") is not None and any(dev.glob("ipmi*"))


class IpmiCollector:
    name = "ipmi"

    def __init__(
        self,
        command: list[str] | None = None,
        *,
        effects: Effects | None = None,
        min_interval: float = 10.0,
    ) -> None:
        self.command = command or ["ipmitool", "dcmi", "power", "reading"]
        self.effects = effects or Effects()
        self.min_interval = min_interval
        self._last: PowerSample | None = None

    def collect(self, now: float) -> list[PowerSample]:
        if self._last is not None and now - self._last.at < self.min_interval:
            return [self._last]
        result = self.effects.run(*self.command, timeout=5)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(self.command)}: {result.stderr.strip()[:200]}")
        watts = parse_dcmi_power(result.stdout)
        if watts is None:
            return []
        self._last = PowerSample("ipmi", "dcmi", PowerScope.SYSTEM, now, watts=watts)
        return [self._last]


@register("ipmi", power=True)
def _from_config(config: AgentConfig) -> IpmiCollector | None:
    power = config.power
    if power.ipmi is True or (power.ipmi == "auto" and available(config.dev_root)):
        return IpmiCollector(power.ipmi_command, min_interval=power.ipmi_interval_s)
    return None
