"""Redfish: the BMC's chassis power (PowerControl[].PowerConsumedWatts): whole system."""

from __future__ import annotations

from typing import Any

import httpx

from agent.collectors import register
from agent.config import AgentConfig
from agent.contract.wire import PowerScope
from agent.power import PowerSample


def parse_chassis_power(document: dict[str, Any]) -> float | None:
    readings = [
        control.get("PowerConsumedWatts")
        for control in document.get("PowerControl", [])
        if isinstance(control, dict)
    ]
    numbers = [float(r) for r in readings if isinstance(r, int | float) and r >= 0]
    return sum(numbers) if numbers else None


class RedfishCollector:
    name = "redfish"

    def __init__(
        self,
        url: str,
        *,
        auth: tuple[str, str] | None = None,
        verify: bool = True,
        min_interval: float = 10.0,
    ) -> None:
        """url: the chassis power resource, e.g. https://bmc/redfish/v1/Chassis/1/Power."""
        self.url = url
        self.client = httpx.Client(auth=auth, verify=verify, timeout=3.0)
        self.min_interval = min_interval
        self._last: PowerSample | None = None

    def collect(self, now: float) -> list[PowerSample]:
        if self._last is not None and now - self._last.at < self.min_interval:
            return [self._last]
        response = self.client.get(self.url)
        response.raise_for_status()
        watts = parse_chassis_power(response.json())
        if watts is None:
            return []
        self._last = PowerSample(
            "redfish", self.url.rsplit("/Chassis/", 1)[-1], PowerScope.SYSTEM, now, watts=watts
        )
        return [self._last]


@register("redfish", power=True)
def _from_config(config: AgentConfig) -> RedfishCollector | None:
    power = config.power
    if not power.redfish_url:
        return None
    auth = None
    if power.redfish_username and power.redfish_password_file:
        secret = power.redfish_password_file.read_text().strip()
        auth = (power.redfish_username, secret)
    return RedfishCollector(power.redfish_url, auth=auth, verify=power.redfish_verify_tls)
