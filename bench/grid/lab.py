"""The policy grid on the lab's test device: flashsim under Debian 6.1 at a ULL and a flash
latency, with poll queues, every candidate configuration of the policy search (fios loaded;
interrupt, classic and hybrid polling) by the grid workloads, repeated — one boot per device
and repeat, configurations in a fresh order each time. See bench/policy_grid.py."""

from __future__ import annotations

import random
from pathlib import Path

from agent.bench import fio as fio_jobs
from agent.bench.fairness import Alone, fairness
from agent.bench.target import BenchTarget
from agent.contract.tunables import CompletionMode, DeviceConfig, Scheduler
from agent.contract.wire import DeviceCapabilities, PollCapabilities
from agent.contract.workloads import IOEngine, WorkloadSpec
from bench.grid import grid_workloads
from kernel.lab import build, packages, scenarios
from models.features import DeviceFacts
from models.grid import Grid, GridDevice, default_config
from models.search import candidates

# flashsim settings: ULL-like reads (5 µs; writes three times that) and the fairness
# scenarios' flash (250 µs reads, 4 ms writes that occupy every unit); both with a poll queue
# whose completions take as long as interrupt-driven ones
LAB_DEVICES = {
    "lab-flashsim-ull": (
        "ull",
        "units=4 read_lat_ns=5000 read_ns_per_kb=20 write_lat_ns=15000 write_ns_per_kb=20",
    ),
    "lab-flashsim-flash": ("nvme_flash", scenarios.FLASH_LIKE),
}
QUEUE = "/sys/block/flashsim0/queue"
TARGET = BenchTarget(Path("/dev/flashsim0"), "flashsim0", False, False)
AVAILABLE = (Scheduler.NONE, Scheduler.MQ_DEADLINE, Scheduler.KYBER, Scheduler.BFQ, Scheduler.FIOS)


def _facts_row(name: str, device_class: str, hw_queues: int) -> dict[str, object]:
    capabilities = DeviceCapabilities(
        available_schedulers=list(AVAILABLE),
        nr_hw_queues=hw_queues,
        poll=PollCapabilities(io_poll=True, poll_queues=1, hybrid_supported=True),
    )
    return {
        "name": name,
        "device_class": device_class,
        "rotational": False,
        "capabilities": capabilities.model_dump(mode="json", exclude_none=True),
    }


def _polled(workload: WorkloadSpec, completion: CompletionMode | None) -> WorkloadSpec:
    """Since 5.16 only the application decides to poll: io_uring with IOPOLL (fio's hipri).
    Synchronous psync workloads cannot poll and run as they are."""
    if completion in (None, CompletionMode.INTERRUPT) or workload.engine is not IOEngine.IO_URING:
        return workload
    return workload.model_copy(update={"engine": IOEngine.IO_URING_POLL})


def script_for(
    params: str, plan: list[tuple[int, DeviceConfig]], workloads: list[WorkloadSpec]
) -> tuple[str, dict[str, str]]:
    """One boot: the device, then each (index, configuration) of the plan in its order, every
    workload under it (each job alone first where tasks share the device, for fairness)."""
    files: dict[str, str] = {}
    script = scenarios.FLASHSIM.format(params=f"{params} poll_queues=1")
    script += "".join(f"insmod /lib/modules/{m}.ko\n" for m in ("kyber-iosched", "bfq", "fios"))
    script += (
        f"echo BLKPILOT-STATS-BEGIN inventory\necho scheduler $(cat {QUEUE}/scheduler | tr ' ' ,)\n"
        "echo hw_queues $(ls /sys/block/flashsim0/mq | wc -l)\n"
        f"for f in {QUEUE}/iosched/*; do echo $(basename $f) $(cat $f); done\n"
        "echo BLKPILOT-STATS-END\n"
    )
    for index, config in plan:
        scheduler = (config.scheduler or Scheduler.NONE).value
        completion = config.completion
        script += f"echo none > {QUEUE}/scheduler\necho {scheduler} > {QUEUE}/scheduler\n"
        for name, value in config.scheduler_tunables.items():
            script += f"echo {value} > {QUEUE}/iosched/{name}\n"
        delay = "0" if completion is CompletionMode.HYBRID_POLL else "-1"
        script += f"echo {delay} > {QUEUE}/io_poll_delay\n"
        for workload in workloads:
            prefix = f"{index}/{workload.name}"
            spec = _polled(workload, completion)
            script += "".join(scenarios.fio_runs(prefix, spec, TARGET, files).values())
    script += f"echo none > {QUEUE}/scheduler\nrmmod fios\nrmmod flashsim\n"
    script += "test -e /sys/block/flashsim0 && echo BLKPILOT-UNLOAD-FAILED\n"
    return script, files


def metrics_of(
    parsed: dict[str, fio_jobs.FioResult], index: int, workload: str
) -> dict[str, float]:
    together = parsed[f"{index}/{workload}/together"]
    metrics = dict(together.metrics)
    alone = {}
    for task in together.tasks:
        solo = parsed.get(f"{index}/{workload}/alone-{task.job}")
        if solo is None:
            return metrics
        (first, *_) = solo.tasks
        alone[task.job] = Alone(first.mean_latency_us, first.iops)
    metrics.update(fairness(together.tasks, alone))
    return metrics


def run_grid(
    *,
    repeats: int = 2,
    seconds: float = 1.0,
    seed: int = 1,
    cache: Path = packages.DEFAULT_CACHE,
    devices: dict[str, tuple[str, str]] | None = None,
    limit_configs: int | None = None,
    workload_names: tuple[str, ...] | None = None,
) -> Grid:
    trio = packages.select_trio()
    root = packages.fetch(trio, cache, with_build=True)
    modules = scenarios._modules(root, trio, ["kyber-iosched", "bfq"])
    modules += [
        build.build_module(m, root, trio, cache / trio.version / "build")
        for m in ("flashsim", "fios")
    ]
    workloads = grid_workloads(seconds, warmup_s=0.2)
    if workload_names is not None:
        workloads = [w for w in workloads if w.name in workload_names]
    grid = Grid(meta={"lab_kernel": trio.abi})
    grid.workloads = {w.name: w for w in workloads}
    rng = random.Random(seed)
    for label, (device_class, params) in (devices or LAB_DEVICES).items():
        # the candidates depend only on the schedulers and the poll queue, known beforehand
        configs = candidates(
            DeviceFacts.from_inventory(_facts_row(label, device_class, 1), {}), AVAILABLE
        )[:limit_configs]
        for repeat in range(repeats):
            plan = list(enumerate(configs))
            rng.shuffle(plan)
            script, files = script_for(params, plan, workloads)
            booted, parsed = scenarios._boot(
                f"grid-{label}-{repeat}",
                trio,
                root,
                modules,
                script,
                files,
                seconds + 0.2 + 2.0,
                cache,
            )
            if booted.kernel_problems():
                raise RuntimeError(f"{label}: kernel problems: {booted.kernel_problems()}")
            if label not in grid.devices:  # what the kernel gave the device, seen in the guest
                inventory = booted.stats.get("inventory", {})
                listed = inventory.get("scheduler", "").split(",")
                current = next((s.strip("[]") for s in listed if s.startswith("[")), None)
                tunables = {
                    k: int(v)
                    for k, v in inventory.items()
                    if k not in ("scheduler", "hw_queues") and v.lstrip("-").isdigit()
                }
                row = _facts_row(label, device_class, int(inventory.get("hw_queues", "1")))
                grid.devices[label] = GridDevice(
                    label,
                    row,
                    AVAILABLE,
                    default_config(Scheduler(current) if current else None, tunables),
                    f"lab flashsim ({params}, poll_queues=1) under {trio.abi} in QEMU TCG",
                )
            for index, config in enumerate(configs):
                for workload in workloads:
                    grid.add_run(
                        label,
                        workload.name,
                        config,
                        repeat,
                        metrics_of(parsed, index, workload.name),
                    )
    return grid
