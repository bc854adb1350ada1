"""Energy over a benchmark run, from the same power sources the agent reports."""

from __future__ import annotations

import time

from agent.collectors import Collector, CollectorSet
from agent.contract.wire import PowerScope
from agent.power import PowerSample, WindowEnergy, primary, window_energy


class EnergyMeter:
    def __init__(self, sources: list[Collector]) -> None:
        self.sources = CollectorSet(sources)
        self._start: list[PowerSample] = []

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> WindowEnergy | None:
        """The run's energy from the widest-scope source, or None without one."""
        earlier = {sample.key: sample for sample in self._start}
        energies = [
            energy
            for sample in self._read()
            if sample.key in earlier and (energy := window_energy(earlier[sample.key], sample))
        ]
        return primary(energies)

    def _read(self) -> list[PowerSample]:
        results = self.sources.collect(time.time())
        return [sample for samples in results.values() for sample in samples]


def energy_metrics(energy: WindowEnergy | None, ios: float, io_bytes: float) -> dict[str, float]:
    """The run's energy figures; an estimate's under names of their own (`*_estimated`): a
    measured and an estimated joule are never one metric."""
    if energy is None or energy.joules <= 0:
        return {}
    suffix = "_estimated" if energy.scope is PowerScope.ESTIMATED else ""
    return {
        f"energy_joules{suffix}": energy.joules,
        f"power_watts{suffix}": energy.watts,
        f"joules_per_mio{suffix}": energy.joules / (ios / 1e6) if ios else 0.0,
        f"bytes_per_joule{suffix}": io_bytes / energy.joules,
    }
