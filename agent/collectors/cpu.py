"""/proc/stat: CPU time and context switches — the cost of polling in the HotStorage '22 paper."""

from __future__ import annotations

from dataclasses import dataclass

from agent.collectors import register
from agent.config import AgentConfig
from agent.host import HostPaths, read_text


@dataclass(frozen=True)
class CpuStat:
    busy_ticks: int
    total_ticks: int
    context_switches: int


def parse_stat(text: str) -> CpuStat:
    busy = total = switches = 0
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            # user nice system idle iowait irq softirq steal (guest time is inside user)
            ticks = [int(f) for f in fields[1:9]]
            total = sum(ticks)
            busy = total - ticks[3] - ticks[4]
        elif fields and fields[0] == "ctxt":
            switches = int(fields[1])
    return CpuStat(busy, total, switches)


def parse_cpu_pressure(text: str) -> int | None:
    """From /proc/pressure/cpu (Documentation/accounting/psi.rst): the microseconds in which
    some runnable task waited for a CPU, since boot; None if the line is not there."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for item in fields[1:]:
                if item.startswith("total="):
                    return int(item.removeprefix("total="))
    return None


def cpu_pressure_us(paths: HostPaths) -> int | None:
    """The host's CPU stall time so far (µs): None where the kernel has no PSI (built without
    it, or booted psi=0)."""
    text = read_text(paths.proc / "pressure" / "cpu")
    return parse_cpu_pressure(text) if text is not None else None


class CpuCollector:
    name = "cpu"

    def __init__(self, paths: HostPaths) -> None:
        self.path = paths.proc / "stat"

    def collect(self, now: float) -> CpuStat:
        text = read_text(self.path)
        if text is None:
            raise OSError(f"cannot read {self.path}")
        return parse_stat(text)


@register("cpu")
def _from_config(config: AgentConfig) -> CpuCollector:
    return CpuCollector(config.paths)
