"""The collectors for every power source that exists on this node, from the configuration."""

from __future__ import annotations

import logging

from agent.collectors import Collector
from agent.collectors.hwmon import HwmonCollector
from agent.collectors.ipmi import IpmiCollector
from agent.collectors.ipmi import available as ipmi_available
from agent.collectors.meter import MeterCollector
from agent.collectors.rapl import RaplCollector
from agent.collectors.redfish import RedfishCollector
from agent.config import AgentConfig

log = logging.getLogger(__name__)


def power_collectors(config: AgentConfig) -> list[Collector]:
    power = config.power
    found: list[Collector] = []
    if power.rapl:
        rapl = RaplCollector(config.paths)
        if rapl.zones:
            found.append(rapl)
    if power.hwmon:
        hwmon = HwmonCollector(config.paths)
        if hwmon.sensors:
            found.append(hwmon)
    if power.ipmi is True or (power.ipmi == "auto" and ipmi_available(config.dev_root)):
        found.append(IpmiCollector(power.ipmi_command, min_interval=power.ipmi_interval_s))
    if power.redfish_url:
        auth = None
        if power.redfish_username and power.redfish_password_file:
            secret = power.redfish_password_file.read_text().strip()
            auth = (power.redfish_username, secret)
        found.append(
            RedfishCollector(power.redfish_url, auth=auth, verify=power.redfish_verify_tls)
        )
    if power.meter_csv:
        found.append(MeterCollector(power.meter_csv))
    log.info("power sources: %s", ", ".join(c.name for c in found) or "none (power unavailable)")
    return found
