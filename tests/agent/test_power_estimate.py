"""Energy where nothing measures it: estimated from CPU time (Kepler's fallback without RAPL),
labelled `estimated`, used only when no measured reading exists, never added to one."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.bench.energy import energy_metrics
from agent.collectors.estimate import USER_HZ, EstimateCollector
from agent.contract.wire import PowerScope
from agent.host import HostPaths
from agent.power import CpuPowerModel, WindowEnergy, primary, window_energy

STAT = "cpu  {user} 0 {system} {idle} 0 0 0 0 0 0\nctxt 100\n"


def _proc(tmp_path: Path, user: int, system: int, idle: int) -> HostPaths:
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc" / "stat").write_text(STAT.format(user=user, system=system, idle=idle))
    return HostPaths(proc=tmp_path / "proc")


def test_a_window_costs_its_busy_and_idle_time(tmp_path: Path) -> None:
    model = CpuPowerModel(active_watts=5.0, idle_watts=1.0)
    collector = EstimateCollector(_proc(tmp_path, 100, 100, 800), model)
    (before,) = collector.collect(0.0)
    # 2 s later on 2 CPUs: 3 s busy (polling spins), 1 s idle
    _proc(tmp_path, 100 + 2 * USER_HZ, 100 + USER_HZ, 800 + USER_HZ)
    (after,) = collector.collect(2.0)
    assert after.scope is PowerScope.ESTIMATED
    energy = window_energy(before, after)
    assert energy is not None
    assert energy.joules == pytest.approx(3 * 5.0 + 1 * 1.0)
    assert energy.watts == pytest.approx(8.0)
    # the same window with the CPUs idle instead costs less: what interrupts save
    _proc(tmp_path, 100 + 2 * USER_HZ, 100 + USER_HZ, 800 + 5 * USER_HZ)
    (idle,) = collector.collect(4.0)
    quiet = window_energy(after, idle)
    assert quiet is not None
    assert quiet.joules < energy.joules


def test_measured_readings_win_and_are_never_mixed_with_the_estimate() -> None:
    estimate = WindowEnergy("estimate", "cpu-time", PowerScope.ESTIMATED, 40.0, 4.0)
    package = WindowEnergy("rapl", "package-0", PowerScope.CPU_PACKAGE, 30.0, 3.0)
    system = WindowEnergy("ipmi", "chassis", PowerScope.SYSTEM, 90.0, 9.0)
    dram = WindowEnergy("rapl", "dram", PowerScope.DRAM, 5.0, 0.5)
    assert primary([estimate]) == estimate
    assert primary([estimate, system]) == system
    chosen = primary([estimate, package])
    assert chosen is not None
    assert chosen.scope is PowerScope.CPU_PACKAGE
    assert chosen.joules == 30.0  # the estimate is not added in
    # a measured reading of any scope means the estimate does not speak for the node
    assert primary([estimate, dram]) is None


def test_estimated_energy_has_metric_names_of_its_own() -> None:
    estimate = WindowEnergy("estimate", "cpu-time", PowerScope.ESTIMATED, 2.0, 1.0)
    measured = WindowEnergy("rapl", "package-0", PowerScope.CPU_PACKAGE, 2.0, 1.0)
    assert set(energy_metrics(estimate, 1e6, 4e9)) == {
        "energy_joules_estimated",
        "power_watts_estimated",
        "joules_per_mio_estimated",
        "bytes_per_joule_estimated",
    }
    assert energy_metrics(estimate, 1e6, 4e9)["joules_per_mio_estimated"] == pytest.approx(2.0)
    assert set(energy_metrics(measured, 1e6, 4e9)) == {
        "energy_joules",
        "power_watts",
        "joules_per_mio",
        "bytes_per_joule",
    }
