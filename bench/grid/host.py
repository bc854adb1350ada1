"""Measuring a ground-truth grid on this host's block devices (loop devices made for it):
every candidate configuration, applied through the agent's applier (allow-list, snapshot,
rollback), every workload measured with the agent's own fio runner, repeated, the
configurations in a fresh order each repeat."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from agent.applier import Applier
from agent.bench.measure import measure
from agent.bench.target import device_target
from agent.contract.tunables import DeviceConfig
from agent.contract.workloads import WorkloadSpec
from agent.discovery import KernelFacts, describe
from agent.effects import Effects
from agent.errors import ChangeRefused
from agent.host import HostPaths
from models.features import DeviceFacts, config_key
from models.grid import Grid, GridDevice, default_config
from models.search import candidates


def describe_device(paths: HostPaths, label: str, name: str, source: str) -> GridDevice:
    kernel = KernelFacts.of(paths)
    found = describe(paths, name, kernel, Effects()).inventory
    caps = found.capabilities
    return GridDevice(
        label,
        {
            "name": label,
            "device_class": found.device_class.value,
            "rotational": found.rotational,
            "capabilities": caps.model_dump(mode="json", exclude_none=True),
        },
        tuple(caps.available_schedulers),
        default_config(caps.current_scheduler, caps.scheduler_tunables),
        f"{source} ({kernel.release})",
    )


def all_candidates(device: GridDevice) -> list[DeviceConfig]:
    return candidates(DeviceFacts.from_inventory(device.row, {}), device.available)


def measure_host_grid(
    devices: dict[str, tuple[str, str]],  # label -> (block device name, what it is)
    workloads: list[WorkloadSpec],
    *,
    repeats: int,
    work: Path,
    seed: int = 1,
    configs: Callable[[GridDevice], list[DeviceConfig]] = all_candidates,
    progress: Callable[[str], None] = lambda line: None,
) -> Grid:
    paths = HostPaths()
    applier = Applier(paths, work / "agent")
    grid = Grid(meta={"host_kernel": KernelFacts.of(paths).release})
    grid.workloads = {w.name: w for w in workloads}
    plans = {}
    for label, (name, source) in devices.items():
        grid.devices[label] = describe_device(paths, label, name, source)
        plans[label] = configs(grid.devices[label])
    rng = random.Random(seed)
    total = sum(len(p) for p in plans.values()) * repeats
    done, started = 0, time.monotonic()
    for repeat in range(repeats):
        for label, (name, _) in devices.items():
            target = device_target(paths, name, applier.effects)
            order = list(plans[label])
            rng.shuffle(order)
            for config in order:
                try:
                    applier.apply(name, config)
                    changed = True
                except ChangeRefused:  # the device is in this configuration already
                    changed = False
                try:
                    for workload in workloads:
                        result = measure(
                            workload, target, workdir=work / "bench", effects=applier.effects
                        )
                        grid.add_run(label, workload.name, config, repeat, result.metrics)
                finally:
                    if changed:
                        applier.rollback(name)
                done += 1
                left = (time.monotonic() - started) / done * (total - done)
                progress(
                    f"[{done}/{total}] {label} r{repeat} {config_key(config)}"
                    f" (~{left / 60:.0f} min left)"
                )
    return grid
