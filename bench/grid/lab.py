"""The policy grid on the lab's test device: flashsim under Debian 6.1 at a ULL and a flash
latency, with poll queues, every candidate configuration of the policy search (fios loaded;
interrupt, classic and hybrid polling) by the grid workloads, repeated — one boot per device
and repeat, configurations in a fresh order each time. See bench/policy_grid.py."""

from __future__ import annotations

import random
from dataclasses import dataclass
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


@dataclass(frozen=True)
class LabDevice:
    """A test device the guest creates: its class as the inventory would say, the script lines
    that create it, its block device name, and how many poll queues it has."""

    device_class: str
    load: str
    block: str
    poll_queues: int
    modules: tuple[str, ...]  # stock modules it needs, loaded before it
    ours: tuple[str, ...]  # the project's modules it needs

    @property
    def queue(self) -> str:
        return f"/sys/block/{self.block}/queue"

    @property
    def target(self) -> BenchTarget:
        return BenchTarget(Path(f"/dev/{self.block}"), self.block, False, False)


def _flashsim(device_class: str, params: str) -> LabDevice:
    # every flashsim setting has a poll queue whose completions take as long as interrupt-driven
    # ones (a polled request completes only once its service time has passed)
    load = scenarios.FLASHSIM.format(params=f"{params} poll_queues=1")
    return LabDevice(device_class, load, "flashsim0", 1, (), ("flashsim",))


# Devices that differ the way real ones do. flashsim: ULL-like reads (5 µs; writes three
# times that); the fairness scenarios' flash (250 µs reads on 4 units, 4 ms writes that occupy
# every unit); SATA-like (2 units, 120 µs reads, 1.5 ms writes on both units: strong write
# asymmetry, little parallelism, 4 µs/KiB ≈ 250 MB/s); striped reads (16 units, 200 µs reads,
# 800 µs writes on one unit: reads scale with depth). null_blk: 10 µs timer completions on any
# number of requests at once, no asymmetry, no poll queue (null_blk's polled completions ignore
# completion_nsec: not a device model, KERNEL-LAB.md), data not kept (its pages would fill the
# guest's memory over a grid).
# Added for issue 33 item 3 (features that vary: a latency at each order of magnitude, write
# asymmetry from none to 16x, 1 to 16 units, null_blk's unlimited parallelism): null_blk at 100
# µs, NVMe-read-like; flashsim with symmetric 100 µs reads and writes on 8 units; flashsim with
# one unit (60 µs reads, 10x writes: a small eMMC/SATA part that serves one request at a time);
# flashsim at 1 ms reads and 3 ms writes on 2 units (a slow SATA part); null_blk at 5 µs with a
# poll queue (its polled completions come at the first poll: polling's best case, not a model
# of a device's polled latency — but the only device here where a completion mode matters
# that much, which the models should see once).
LAB_DEVICES = {
    "lab-flashsim-ull": _flashsim(
        "ull", "units=4 read_lat_ns=5000 read_ns_per_kb=20 write_lat_ns=15000 write_ns_per_kb=20"
    ),
    "lab-flashsim-flash": _flashsim("nvme_flash", scenarios.FLASH_LIKE),
    "lab-flashsim-sata": _flashsim(
        "sata_ssd",
        "units=2 write_units=2 read_lat_ns=120000 read_ns_per_kb=4000"
        " write_lat_ns=1500000 write_ns_per_kb=4000",
    ),
    "lab-flashsim-striped": _flashsim(
        "nvme_flash",
        "units=16 read_lat_ns=200000 read_ns_per_kb=500 write_lat_ns=800000 write_ns_per_kb=500",
    ),
    "lab-nullblk": LabDevice(
        "ull",
        "insmod /lib/modules/configfs.ko\ninsmod /lib/modules/null_blk.ko queue_mode=2"
        " irqmode=2 completion_nsec=10000 gb=1 submit_queues=1 hw_queue_depth=64\n",
        "nullb0",
        0,
        ("configfs", "null_blk"),
        (),
    ),
    "lab-nullblk-100us": LabDevice(
        "nvme_flash",
        "insmod /lib/modules/configfs.ko\ninsmod /lib/modules/null_blk.ko queue_mode=2"
        " irqmode=2 completion_nsec=100000 gb=1 submit_queues=1 hw_queue_depth=64\n",
        "nullb0",
        0,
        ("configfs", "null_blk"),
        (),
    ),
    "lab-flashsim-symmetric": _flashsim(
        "nvme_flash",
        "units=8 write_units=1 read_lat_ns=100000 read_ns_per_kb=250"
        " write_lat_ns=100000 write_ns_per_kb=250",
    ),
    "lab-flashsim-one-unit": _flashsim(
        "sata_ssd",
        "units=1 write_units=1 read_lat_ns=60000 read_ns_per_kb=1000"
        " write_lat_ns=600000 write_ns_per_kb=1000",
    ),
    "lab-flashsim-slow": _flashsim(
        "sata_ssd",
        "units=2 write_units=2 read_lat_ns=1000000 read_ns_per_kb=8000"
        " write_lat_ns=3000000 write_ns_per_kb=8000",
    ),
    "lab-nullblk-poll": LabDevice(
        "ull",
        "insmod /lib/modules/configfs.ko\ninsmod /lib/modules/null_blk.ko queue_mode=2"
        " irqmode=2 completion_nsec=5000 gb=1 submit_queues=1 poll_queues=1"
        " hw_queue_depth=64\n",
        "nullb0",
        1,
        ("configfs", "null_blk"),
        (),
    ),
}
AVAILABLE = (Scheduler.NONE, Scheduler.MQ_DEADLINE, Scheduler.KYBER, Scheduler.BFQ, Scheduler.FIOS)


def _facts_row(name: str, device_class: str, hw_queues: int, poll_queues: int) -> dict[str, object]:
    capabilities = DeviceCapabilities(
        available_schedulers=list(AVAILABLE),
        nr_hw_queues=hw_queues,
        poll=PollCapabilities(
            io_poll=poll_queues > 0, poll_queues=poll_queues, hybrid_supported=poll_queues > 0
        ),
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
    device: LabDevice, plan: list[tuple[int, DeviceConfig]], workloads: list[WorkloadSpec]
) -> tuple[str, dict[str, str]]:
    """One boot: the device, then each (index, configuration) of the plan in its order, every
    workload under it (each job alone first where tasks share the device, for fairness)."""
    files: dict[str, str] = {}
    queue = device.queue
    script = device.load
    script += "".join(f"insmod /lib/modules/{m}.ko\n" for m in ("kyber-iosched", "bfq", "fios"))
    script += (
        f"echo BLKPILOT-STATS-BEGIN inventory\necho scheduler $(cat {queue}/scheduler | tr ' ' ,)\n"
        f"echo hw_queues $(ls /sys/block/{device.block}/mq | wc -l)\n"
        f"for f in {queue}/iosched/*; do echo $(basename $f) $(cat $f); done\n"
        "echo BLKPILOT-STATS-END\n"
    )
    for index, config in plan:
        scheduler = (config.scheduler or Scheduler.NONE).value
        completion = config.completion
        script += f"echo none > {queue}/scheduler\necho {scheduler} > {queue}/scheduler\n"
        for name, value in config.scheduler_tunables.items():
            script += f"echo {value} > {queue}/iosched/{name}\n"
        if device.poll_queues:
            delay = "0" if completion is CompletionMode.HYBRID_POLL else "-1"
            script += f"echo {delay} > {queue}/io_poll_delay\n"
        for workload in workloads:
            prefix = f"{index}/{workload.name}"
            spec = _polled(workload, completion)
            runs = scenarios.fio_runs(prefix, spec, device.target, files)
            together = f"{prefix}/together"
            for label, lines in runs.items():
                if label != together:
                    script += lines
                    continue
                # the guest's CPU time around the run, for its estimated energy
                script += "before=$(head -1 /proc/stat)\n" + lines
                script += (
                    f'echo BLKPILOT-STATS-BEGIN {together}\necho "before $before"\n'
                    'echo "after $(head -1 /proc/stat)"\necho BLKPILOT-STATS-END\n'
                )
    driver = "flashsim" if device.block.startswith("flashsim") else "null_blk"
    script += f"echo none > {queue}/scheduler\nrmmod fios\nrmmod {driver}\n"
    script += f"test -e /sys/block/{device.block} && echo BLKPILOT-UNLOAD-FAILED\n"
    return script, files


def metrics_of(
    parsed: dict[str, fio_jobs.FioResult],
    index: int,
    workload: str,
    counters: dict[str, dict[str, str]] | None = None,
) -> dict[str, float]:
    together = parsed[f"{index}/{workload}/together"]
    metrics = dict(together.metrics)
    cpu = (counters or {}).get(f"{index}/{workload}/together", {})
    if "before" in cpu and "after" in cpu:  # energy estimated from the guest's CPU time
        metrics.update(scenarios.estimated_energy(cpu["before"], cpu["after"], metrics["iops"]))
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
    devices: dict[str, LabDevice] | None = None,
    limit_configs: int | None = None,
    workload_names: tuple[str, ...] | None = None,
) -> Grid:
    trio = packages.select_trio()
    root = packages.fetch(trio, cache, with_build=True)
    devices = devices or LAB_DEVICES
    stock = sorted({m for d in devices.values() for m in d.modules})
    modules = scenarios._modules(root, trio, [*stock, "kyber-iosched", "bfq"])
    ours = sorted({m for d in devices.values() for m in d.ours})
    modules += [
        build.build_module(m, root, trio, cache / trio.version / "build") for m in (*ours, "fios")
    ]
    workloads = grid_workloads(seconds, warmup_s=0.2)
    if workload_names is not None:
        workloads = [w for w in workloads if w.name in workload_names]
    grid = Grid(meta={"lab_kernel": trio.abi})
    grid.workloads = {w.name: w for w in workloads}
    rng = random.Random(seed)
    for label, device in devices.items():
        # the candidates depend only on the schedulers and the poll queue, known beforehand
        facts = _facts_row(label, device.device_class, 1, device.poll_queues)
        configs = candidates(DeviceFacts.from_inventory(facts, {}), AVAILABLE)[:limit_configs]
        for repeat in range(repeats):
            plan = list(enumerate(configs))
            rng.shuffle(plan)
            script, files = script_for(device, plan, workloads)
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
                hw_queues = int(inventory.get("hw_queues", "1"))
                row = _facts_row(label, device.device_class, hw_queues, device.poll_queues)
                created = " ".join(device.load.split("insmod /lib/modules/")[-1].split())
                grid.devices[label] = GridDevice(
                    label,
                    row,
                    AVAILABLE,
                    default_config(Scheduler(current) if current else None, tunables),
                    f"lab {created} under {trio.abi} in QEMU TCG",
                )
            for index, config in enumerate(configs):
                for workload in workloads:
                    grid.add_run(
                        label,
                        workload.name,
                        config,
                        repeat,
                        metrics_of(parsed, index, workload.name, booted.stats),
                    )
    return grid
