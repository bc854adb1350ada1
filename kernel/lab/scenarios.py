"""Lab scenarios: a shell script for the guest, the modules it loads, and how its fio
results are read back on the host."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.bench import fio as fio_results
from kernel.lab import initramfs, packages, qemu

STOCK = ("none", "mq-deadline", "kyber", "bfq")


def _fio_block(label: str, options: str) -> str:
    return (
        f"fio --output-format=json+ --output=/tmp/out.json --lat_percentiles=1 --clat_percentiles=0"
        f" --randrepeat=0 --norandommap {options}\n"
        f"echo BLKPILOT-RESULT-BEGIN {label}\ncat /tmp/out.json\necho BLKPILOT-RESULT-END\n"
    )


def null_overhead_script(rounds: int, seconds: float) -> str:
    """HotStorage '23's overhead case: 4 KB QD1 synchronous random reads on null_blk with a
    10 µs completion time, under each stock scheduler, in alternating rounds."""
    lines = [
        "insmod /lib/modules/configfs.ko",
        "insmod /lib/modules/null_blk.ko queue_mode=2 irqmode=2 completion_nsec=10000"
        " memory_backed=1 gb=1 submit_queues=1 hw_queue_depth=64",
        "insmod /lib/modules/kyber-iosched.ko",
        "insmod /lib/modules/bfq.ko",
    ]
    script = "\n".join(lines) + "\n"
    for r in range(rounds):
        for scheduler in STOCK:
            script += f"echo {scheduler} > /sys/block/nullb0/queue/scheduler\n"
            script += _fio_block(
                f"{scheduler}/{r}",
                "--name=qd1 --filename=/dev/nullb0 --direct=1 --ioengine=psync --rw=randread"
                f" --bs=4k --iodepth=1 --time_based --runtime={seconds} --ramp_time=0.5"
                " --size=512m",
            )
    return script


@dataclass
class LabResult:
    scenario: str
    kernel: str
    boot_seconds: float
    runs: dict[str, dict[str, float]]  # label -> fio metrics
    kernel_problems: list[str]
    summary: dict[str, Any] = field(default_factory=dict)


def _modules(root: Path, trio: packages.KernelTrio, names: list[str]) -> list[Path]:
    found = []
    base = packages.modules_dir(root, trio) / "kernel"
    for name in names:
        (module,) = base.rglob(f"{name}.ko")
        found.append(module)
    return found


def summarize_overhead(runs: dict[str, dict[str, float]]) -> dict[str, Any]:
    mean = {
        s: statistics.mean(
            m["lat_mean_us"] for label, m in runs.items() if label.startswith(f"{s}/")
        )
        for s in STOCK
    }
    p50 = {
        s: statistics.mean(
            m["lat_p50_us"] for label, m in runs.items() if label.startswith(f"{s}/")
        )
        for s in STOCK
    }
    return {
        "mean_latency_us": {s: round(v, 2) for s, v in mean.items()},
        "p50_latency_us": {s: round(v, 2) for s, v in p50.items()},
        "relative_to_none": {s: round(mean[s] / mean["none"], 3) for s in STOCK},
    }


@dataclass(frozen=True)
class Scenario:
    modules: list[str]
    script: Callable[[int, float], str]
    summarize: Callable[[dict[str, dict[str, float]]], dict[str, Any]]


SCENARIOS = {
    "null-overhead": Scenario(
        ["configfs", "null_blk", "kyber-iosched", "bfq"], null_overhead_script, summarize_overhead
    ),
}


def run(
    name: str, *, rounds: int = 2, seconds: float = 2.0, cache: Path = packages.DEFAULT_CACHE
) -> LabResult:
    scenario = SCENARIOS[name]
    trio = packages.select_trio()
    root = packages.fetch(trio, cache)
    initrd = initramfs.build(
        cache / trio.version / f"{name}.initrd.gz",
        modules=_modules(root, trio, scenario.modules),
        scenario=scenario.script(rounds, seconds),
    )
    booted = qemu.boot(
        packages.vmlinuz(root, trio), initrd, timeout=120 + rounds * 8 * (seconds + 3)
    )
    runs = {}
    for label, body in booted.results.items():
        document = json.loads(body[body.index("{") :])
        runs[label] = fio_results.parse(document).metrics
    result = LabResult(name, trio.abi, booted.seconds, runs, booted.kernel_problems())
    result.summary = scenario.summarize(runs)
    return result
