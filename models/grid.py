"""A ground-truth grid: every candidate configuration measured, repeated, on each device and
workload. It is what `blkpilot eval` judges the policy search against (models.evaluate), and
what `python -m bench.policy_grid` measures (with bench/grid/) on this machine's loop devices
and the kernel lab's test device.

Stored as one JSON document: the devices (an inventory-like row, the schedulers they offer,
the configuration the kernel gave them), the workloads, and one entry per run.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.wire import DeviceClass
from agent.contract.workloads import WorkloadSpec
from models.dataset import OBJECTIVE_METRIC, Sample
from models.features import DeviceFacts, config_key
from models.priors import Objective
from models.search import candidates

# what a run keeps: every objective's metric and what explains it
KEPT_METRICS = (
    *(metric for metric, _ in OBJECTIVE_METRIC.values()),
    "lat_mean_us",
    "concurrent_efficiency",
    "worst_slowdown",
    "context_switches_per_io",
    # the lab's runs: the guest CPU's busy share (the estimated energy's input)
    "cpu_busy_share",
)
GRID_NAMESPACE = uuid.UUID("6f1d3c52-8a1e-4c7b-9f0e-5b2d7e4a9c10")


def default_config(scheduler: Scheduler | None, tunables: Mapping[str, int]) -> DeviceConfig:
    """The configuration a device is in, as the candidate grid names it: its scheduler and
    the values of the parameters the grid varies (the kernel's defaults, on a new device)."""
    if scheduler is None:
        return DeviceConfig()
    varied = {
        name
        for config in candidates(DeviceFacts(DeviceClass.UNKNOWN), [scheduler])
        for name in config.scheduler_tunables
    }
    return DeviceConfig(
        scheduler=scheduler, scheduler_tunables={k: v for k, v in tunables.items() if k in varied}
    )


@dataclass(frozen=True)
class GridDevice:
    name: str
    row: dict[str, Any]  # device_class, rotational, capabilities — as the inventory shows it
    available: tuple[Scheduler, ...]
    default: DeviceConfig  # what the kernel gave the device
    source: str  # "host loop on tmpfs", "lab flashsim ..."

    @property
    def id(self) -> uuid.UUID:
        return uuid.uuid5(GRID_NAMESPACE, self.name)

    @property
    def rotational(self) -> bool:
        return bool(self.row.get("rotational"))


@dataclass(frozen=True)
class GridRun:
    device: str
    workload: str
    config: DeviceConfig
    repeat: int
    metrics: dict[str, float]


@dataclass
class Grid:
    devices: dict[str, GridDevice] = field(default_factory=dict)
    workloads: dict[str, WorkloadSpec] = field(default_factory=dict)
    runs: list[GridRun] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    # --- building ---------------------------------------------------------------------

    def add_run(
        self,
        device: str,
        workload: str,
        config: DeviceConfig,
        repeat: int,
        metrics: Mapping[str, Any],
    ) -> None:
        if device not in self.devices:
            raise KeyError(f"unknown grid device {device!r}")
        if workload not in self.workloads:
            raise KeyError(f"unknown grid workload {workload!r}")
        kept = {
            k: float(v)
            for k, v in metrics.items()
            if k in KEPT_METRICS and isinstance(v, int | float) and math.isfinite(v)
        }
        self.runs.append(GridRun(device, workload, config, repeat, kept))

    def merge(self, other: Grid) -> None:
        self.devices.update(other.devices)
        self.workloads.update(other.workloads)
        self.runs += other.runs
        for key, value in other.meta.items():
            self.meta.setdefault(key, value)

    # --- reading ----------------------------------------------------------------------

    def cells(self) -> list[tuple[str, str]]:
        return sorted({(r.device, r.workload) for r in self.runs})

    def configs(self, device: str, workload: str) -> dict[str, DeviceConfig]:
        return {
            config_key(r.config): r.config
            for r in self.runs
            if r.device == device and r.workload == workload
        }

    def truth(self, device: str, workload: str, objective: Objective) -> dict[str, float]:
        """The mean over repeats of the objective's metric, per configuration of the cell."""
        metric, _ = OBJECTIVE_METRIC[objective]
        values: dict[str, list[float]] = defaultdict(list)
        for run in self.runs:
            if run.device == device and run.workload == workload and metric in run.metrics:
                values[config_key(run.config)].append(run.metrics[metric])
        return {key: statistics.fmean(v) for key, v in values.items() if v}

    def repeats(self, device: str, workload: str, key: str) -> list[GridRun]:
        return [
            r
            for r in self.runs
            if r.device == device and r.workload == workload and config_key(r.config) == key
        ]

    def sample(self, run: GridRun, at: datetime | None = None) -> Sample:
        device = self.devices[run.device]
        return Sample(
            device.id,
            device.row,
            self.workloads[run.workload],
            run.config,
            dict(run.metrics),
            at or datetime.now(UTC),
        )

    def samples(self, *, exclude: Iterable[tuple[str, str]] = ()) -> list[Sample]:
        """Training samples from every run outside the excluded (device, workload) cells."""
        held = set(exclude)
        return [self.sample(r) for r in self.runs if (r.device, r.workload) not in held]

    # --- baselines --------------------------------------------------------------------

    def baselines(self, device: str) -> dict[str, DeviceConfig]:
        """The fixed rules blkpilot must beat: the kernel's default, always none, and the
        common udev rule (none for non-rotational devices, bfq for rotational ones)."""
        found = self.devices[device]
        udev = (
            DeviceConfig(
                scheduler=Scheduler.BFQ,
                scheduler_tunables={"slice_idle_us": 8_000, "low_latency": 1},
            )
            if found.rotational
            else DeviceConfig(scheduler=Scheduler.NONE)
        )
        return {
            "kernel-default": found.default,
            "always-none": DeviceConfig(scheduler=Scheduler.NONE),
            "udev-rotational-rule": udev,
        }

    # --- storage ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "devices": {
                name: {
                    "row": d.row,
                    "available": [s.value for s in d.available],
                    "default": d.default.model_dump(mode="json", exclude_none=True),
                    "source": d.source,
                }
                for name, d in self.devices.items()
            },
            "workloads": {n: w.model_dump(mode="json") for n, w in self.workloads.items()},
            "runs": [
                [
                    r.device,
                    r.workload,
                    r.config.model_dump(mode="json", exclude_none=True),
                    r.repeat,
                    r.metrics,
                ]
                for r in self.runs
            ],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Grid:
        grid = cls(meta=dict(doc.get("meta", {})))
        for name, d in doc["devices"].items():
            grid.devices[name] = GridDevice(
                name,
                d["row"],
                tuple(Scheduler(s) for s in d["available"]),
                DeviceConfig.model_validate(d["default"]),
                d["source"],
            )
        grid.workloads = {n: WorkloadSpec.model_validate(w) for n, w in doc["workloads"].items()}
        for device, workload, config, repeat, metrics in doc["runs"]:
            grid.add_run(device, workload, DeviceConfig.model_validate(config), repeat, metrics)
        return grid

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Grid:
        """A grid as saved, or gzipped (name ending .gz, as the recorded one is)."""
        if path.suffix == ".gz":
            with gzip.open(path, "rt") as handle:
                return cls.from_json(json.load(handle))
        return cls.from_json(json.loads(path.read_text()))

    @classmethod
    def load_all(cls, paths: Iterable[Path]) -> Grid:
        """Several grids judged as one — the main grid and the wider grid's added devices
        (bench/policy_grid.py) — each device measured in one of them only: a device in two
        would mix two sittings' runs under one name."""
        merged = cls()
        for path in paths:
            part = cls.load(path)
            clash = sorted(set(part.devices) & set(merged.devices))
            if clash:
                raise ValueError(f"{path}: devices already in an earlier grid: {', '.join(clash)}")
            merged.merge(part)
        return merged
