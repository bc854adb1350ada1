"""A sweep: every workload under every configuration on one target.

Progress lives in a state file named by what the sweep is (target, workloads, configurations),
written after every cell, so running the same sweep again resumes where it stopped; results
the service has not yet acknowledged are sent again. A cell interrupted mid-change is undone
by the applier's journal before anything else happens."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.applier import Applier
from agent.bench.energy import EnergyMeter
from agent.bench.measure import Measurement, measure
from agent.bench.target import BenchTarget, check_allowed
from agent.contract.tunables import DeviceConfig
from agent.contract.workloads import WorkloadSpec
from agent.errors import AgentError
from agent.fsutil import read_json, write_json_atomic


@dataclass(frozen=True)
class Cell:
    workload: WorkloadSpec
    config: DeviceConfig

    @property
    def key(self) -> str:
        text = self.workload.model_dump_json() + self.config.model_dump_json()
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        scheduler = self.config.scheduler.value if self.config.scheduler else "current"
        return f"{self.workload.name} @ {scheduler}"


def sweep_id(target: BenchTarget, cells: list[Cell]) -> str:
    text = target.label + "|" + ",".join(cell.key for cell in cells)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Sweep:
    def __init__(
        self,
        applier: Applier,
        target: BenchTarget,
        workloads: list[WorkloadSpec],
        configs: list[DeviceConfig],
        *,
        state_dir: Path,
        meter: EnergyMeter | None = None,
        send: Callable[[Measurement, DeviceConfig], None] | None = None,
    ) -> None:
        # configuration outermost: one switch per configuration, not per cell
        self.cells = [Cell(w, c) for c in configs for w in workloads]
        for cell in self.cells:
            check_allowed(target, cell.workload)  # refuse the whole sweep before starting
        if target.device is None and any(c.config != DeviceConfig() for c in self.cells):
            raise AgentError(f"{target.label} has no block device whose queue could be tuned")
        self.applier = applier
        self.target = target
        self.meter = meter
        self.send = send
        self.state_file = state_dir / "sweeps" / f"{sweep_id(target, self.cells)}.json"
        self.state: dict[str, Any] = (
            read_json(self.state_file) if self.state_file.exists() else {"cells": {}}
        )
        self.workdir = state_dir / "bench"

    def done(self, cell: Cell) -> bool:
        return cell.key in self.state["cells"]

    def run(self, progress: Callable[[Cell, str], None] = lambda cell, what: None) -> int:
        """Measure what is left; returns how many cells this call measured."""
        self.applier.recover()
        measured = 0
        for cell in self.cells:
            entry = self.state["cells"].get(cell.key)
            if entry is None:
                progress(cell, "measuring")
                result = self._measure(cell)
                entry = self.state["cells"][cell.key] = {
                    "workload": cell.workload.name,
                    "config": cell.config.model_dump(mode="json"),
                    "metrics": result.metrics,
                    "started_at": result.started_at.isoformat(),
                    "finished_at": result.finished_at.isoformat(),
                    "sent": False,
                }
                write_json_atomic(self.state_file, self.state)
                measured += 1
            if not entry["sent"] and self.send is not None:
                self._send(cell, entry)
            progress(cell, "done")
        return measured

    def _measure(self, cell: Cell) -> Measurement:
        if cell.config == DeviceConfig():
            return measure(
                cell.workload,
                self.target,
                workdir=self.workdir,
                meter=self.meter,
                effects=self.applier.effects,
            )
        device = self.target.device
        assert device is not None
        # held from the change to the rollback: a canary waits, and the agent does not report
        # the device's inventory while it runs a configuration only for this measurement
        with self.applier.device_lock(device):
            self.applier.apply(device, cell.config)
            try:
                return measure(
                    cell.workload,
                    self.target,
                    workdir=self.workdir,
                    meter=self.meter,
                    effects=self.applier.effects,
                )
            finally:
                self.applier.rollback(device)

    def _send(self, cell: Cell, entry: dict[str, Any]) -> None:
        from datetime import datetime

        assert self.send is not None
        measurement = Measurement(
            cell.workload,
            entry["metrics"],
            datetime.fromisoformat(entry["started_at"]),
            datetime.fromisoformat(entry["finished_at"]),
            [],
        )
        try:
            self.send(measurement, cell.config)
        except AgentError:
            return  # kept, and sent when the sweep runs again
        entry["sent"] = True
        write_json_atomic(self.state_file, self.state)

    def results(self) -> list[dict[str, Any]]:
        return [self.state["cells"][c.key] for c in self.cells if self.done(c)]


def load_configs(path: Path) -> list[DeviceConfig]:
    return [DeviceConfig.model_validate(item) for item in json.loads(path.read_text())]
