"""Estimated CPU energy where nothing measures it: /proc/stat's busy and idle time, through
agent.power.CpuPowerModel, as a cumulative counter (scope `estimated`). The agent's power
readings and the benchmarks' energy take it only when no measured source is present."""

from __future__ import annotations

import os

from agent.collectors import register
from agent.collectors.cpu import parse_stat
from agent.config import AgentConfig
from agent.contract.wire import PowerScope
from agent.host import HostPaths, read_text
from agent.power import CpuPowerModel, PowerSample

USER_HZ = os.sysconf("SC_CLK_TCK")


class EstimateCollector:
    name = "estimate"

    def __init__(self, paths: HostPaths, model: CpuPowerModel) -> None:
        self.path = paths.proc / "stat"
        self.model = model

    def collect(self, now: float) -> list[PowerSample]:
        text = read_text(self.path)
        if text is None:
            raise OSError(f"cannot read {self.path}")
        stat = parse_stat(text)
        busy = stat.busy_ticks / USER_HZ
        idle = (stat.total_ticks - stat.busy_ticks) / USER_HZ
        # CPU time since boot, so the counter only grows; a window's energy is its difference
        joules = self.model.joules(busy, idle)
        return [
            PowerSample("estimate", "cpu-time", PowerScope.ESTIMATED, now, energy_joules=joules)
        ]


@register("estimate", power=True)
def _from_config(config: AgentConfig) -> EstimateCollector | None:
    power = config.power
    if not power.estimate:
        return None
    model = CpuPowerModel(power.estimate_active_watts, power.estimate_idle_watts)
    return EstimateCollector(config.paths, model)
