"""Power readings. A source gives either a cumulative energy counter (RAPL, an external meter
integrated as it reports) or an instantaneous power (hwmon, IPMI, Redfish). A window's energy
is the counter's difference, or the mean of the power at its two ends times its length.

Where no source measures (most VMs, this project's CI), the CPU's energy is estimated from its
time busy and idle (`CpuPowerModel`), as Kepler does without RAPL: scope `estimated`, used only
when nothing measured is there, never added to a measured reading, and reported under metric
names of its own (`*_estimated`), so a model never learns from the two as one."""

from __future__ import annotations

from dataclasses import dataclass

from agent.contract.wire import PowerScope


@dataclass(frozen=True)
class CpuPowerModel:
    """CPU power from CPU time: a busy CPU draws `active_watts`, an idle one `idle_watts`
    (per logical CPU). The defaults are a server core's order of magnitude (a 2-socket,
    40-core part of 200-250 W TDP at full load: ~5 W per logical CPU; C-state idle ~1 W); set
    them from a machine of the same kind that has RAPL. An estimate ranks configurations by the
    CPU time they cost (what polling spends), not a measurement of any joule."""

    active_watts: float = 5.0
    idle_watts: float = 1.0

    def joules(self, busy_seconds: float, idle_seconds: float) -> float:
        return self.active_watts * busy_seconds + self.idle_watts * idle_seconds


@dataclass(frozen=True)
class PowerSample:
    source: str  # rapl, hwmon, ipmi, redfish, meter
    zone: str  # package-0, dram, power_meter, chassis 1, …
    scope: PowerScope
    at: float  # time.time() of the reading
    energy_joules: float | None = None  # cumulative, for counters
    watts: float | None = None  # instantaneous

    @property
    def key(self) -> tuple[str, str]:
        return (self.source, self.zone)


@dataclass(frozen=True)
class WindowEnergy:
    source: str
    zone: str
    scope: PowerScope
    joules: float
    watts: float


def window_energy(before: PowerSample, after: PowerSample) -> WindowEnergy | None:
    seconds = after.at - before.at
    if seconds <= 0:
        return None
    if before.energy_joules is not None and after.energy_joules is not None:
        joules = after.energy_joules - before.energy_joules
    elif before.watts is not None and after.watts is not None:
        joules = (before.watts + after.watts) / 2 * seconds
    else:
        return None
    if joules < 0:
        return None
    return WindowEnergy(after.source, after.zone, after.scope, joules, joules / seconds)


# Which reading speaks for the node: the widest scope, then the most direct measurement.
_PREFERENCE = {
    (PowerScope.SYSTEM, "meter"): 0,
    (PowerScope.SYSTEM, "ipmi"): 1,
    (PowerScope.SYSTEM, "redfish"): 2,
    (PowerScope.SYSTEM, "hwmon"): 3,
    (PowerScope.SYSTEM, "rapl"): 4,
}


def primary(energies: list[WindowEnergy]) -> WindowEnergy | None:
    """The system-wide reading if there is one; else all CPU packages summed; else, with no
    measured reading at all, the estimate."""
    system = [e for e in energies if e.scope is PowerScope.SYSTEM]
    if system:
        return min(system, key=lambda e: _PREFERENCE.get((e.scope, e.source), 9))
    packages = [e for e in energies if e.scope is PowerScope.CPU_PACKAGE]
    if not packages:
        measured = [e for e in energies if e.scope is not PowerScope.ESTIMATED]
        estimated = [e for e in energies if e.scope is PowerScope.ESTIMATED]
        return estimated[0] if estimated and not measured else None
    return WindowEnergy(
        "rapl",
        "+".join(e.zone for e in packages),
        PowerScope.CPU_PACKAGE,
        sum(e.joules for e in packages),
        sum(e.watts for e in packages),
    )
