"""Lab scenarios: a shell script for the guest, the modules it loads, and how its fio
results are read back on the host."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scipy import stats

from agent import calibrate
from agent.bench import dbbench
from agent.bench import fio as fio_jobs
from agent.bench.fairness import Alone, fairness
from agent.bench.library import fios, library
from agent.bench.target import BenchTarget
from agent.collectors.cpu import parse_stat
from agent.contract.workloads import DbBenchSpec, WorkloadSpec
from agent.errors import BenchmarkFailed
from agent.power import CpuPowerModel
from kernel.lab import build, hooks, initramfs, packages, qemu

STOCK = ("none", "mq-deadline", "kyber", "bfq")
SCHEDULERS = (*STOCK, "fios")  # fios: kernel/fios, built for the lab kernel
LOADABLE = {"kyber": "kyber-iosched", "bfq": "bfq", "fios": "fios"}  # mq-deadline is built in


def _fio_block(label: str, options: str) -> str:
    return (
        f"fio --eta=never --output-format=json+ --output=/tmp/out.json --lat_percentiles=1"
        " --clat_percentiles=0"
        f" --randrepeat=0 --norandommap {options}\n"
        f"echo BLKPILOT-RESULT-BEGIN {label}\ncat /tmp/out.json\necho BLKPILOT-RESULT-END\n"
    )


OVERHEAD_ORDER = ("none", "mq-deadline", "fios", "kyber", "bfq")  # fios next to its yardstick


def null_overhead_script(
    rounds: int, seconds: float, schedulers: tuple[str, ...] = OVERHEAD_ORDER
) -> str:
    """HotStorage '23's overhead case: 4 KB QD1 synchronous random reads on null_blk with a
    10 µs completion time, under each scheduler. One unrecorded warm-up run first (TCG
    translates fio's code on first use, which inflated whichever scheduler ran first), then
    rounds in a rotated order so that no scheduler always runs at the same point."""
    lines = [
        "insmod /lib/modules/configfs.ko",
        "insmod /lib/modules/null_blk.ko queue_mode=2 irqmode=2 completion_nsec=10000"
        " memory_backed=1 gb=1 submit_queues=1 hw_queue_depth=64",
        *(f"insmod /lib/modules/{LOADABLE[s]}.ko" for s in schedulers if s in LOADABLE),
    ]
    script = "\n".join(lines) + "\n"
    job = (
        "--name=qd1 --filename=/dev/nullb0 --direct=1 --ioengine=psync --rw=randread"
        " --bs=4k --iodepth=1 --time_based --runtime={ms}ms --ramp_time=500ms --size=512m"
    )
    script += f"fio --eta=never --output=/dev/null {job.format(ms=1000)}\n"
    for r in range(rounds):
        shift = r % len(schedulers)
        for scheduler in schedulers[shift:] + schedulers[:shift]:
            script += f"echo {scheduler} > /sys/block/nullb0/queue/scheduler\n"
            script += _fio_block(f"{scheduler}/{r}", job.format(ms=round(seconds * 1000)))
    script += "echo none > /sys/block/nullb0/queue/scheduler\n"
    if "fios" in schedulers:
        script += "rmmod fios\ngrep -q fios /sys/block/nullb0/queue/scheduler"
        script += " && echo BLKPILOT-UNLOAD-FAILED\n"
    return script


FLASHSIM = "insmod /lib/modules/flashsim.ko {params}\n"
# Flash where FIOS matters (FAST '12, section 3): 250 µs reads on 4 parallel units, 4 ms
# writes that occupy all of them (a write blocks reads anywhere and breaks read parallelism),
# 2 µs/KiB read and 1 µs/KiB write transfer. Slower than today's NVMe on purpose: under TCG a
# request costs the guest ~80 µs of CPU, and the device's time must dominate that, as it did
# on the paper's SSDs, for a device-time scheduler to be judged fairly.
FLASH_LIKE = (
    "units=4 write_units=4 read_lat_ns=250000 read_ns_per_kb=2000"
    " write_lat_ns=4000000 write_ns_per_kb=1000"
)
# the review's device: 16 KiB stripes, so that a 128 KiB read takes every unit (two pieces
# each) and a 4 KiB read behind it waits, as on a striped SSD; with the default 64 KiB a
# 128 KiB read took two of four units and 4 KiB readers never met it
FLASH_STRIPED = FLASH_LIKE + " chunk_kb=16"


def fio_runs(
    prefix: str, spec: WorkloadSpec, target: BenchTarget, files: dict[str, str]
) -> dict[str, str]:
    """The workload with all its tasks, then — where tasks share the device — each job alone
    (FIOS's method, for slowdowns): the job files go into `files`; returns, per result label
    (PREFIX/together, PREFIX/alone-JOB), the guest's script lines that run it and print its
    JSON between markers."""
    runs = {f"{prefix}/together": spec}
    if spec.tasks > 1:
        for job in spec.jobs:
            runs[f"{prefix}/alone-{job.name}"] = spec.model_copy(
                update={"jobs": [job.model_copy(update={"tasks": 1})]}
            )
    lines = {}
    for label, run in runs.items():
        name = label.replace("/", "_") + ".fio"
        files[f"jobs/{name}"] = fio_jobs.job_file(run, target)
        lines[label] = (
            f"fio --eta=never --output-format=json+ --output=/tmp/out.json /jobs/{name}\n"
            f"echo BLKPILOT-RESULT-BEGIN {label}\ncat /tmp/out.json\necho BLKPILOT-RESULT-END\n"
        )
    return lines


def fairness_files(
    workloads: list[WorkloadSpec],
    schedulers: tuple[str, ...],
    seconds: float,
    tunables: dict[str, dict[str, int]] | None = None,
    dev: str = "flashsim0",
    guest_cpu: bool = False,
) -> tuple[str, dict[str, str]]:
    """For each workload and scheduler: each job alone, then all together (FIOS's method).
    Each workload starts a fresh scheduler instance (selected through none), with `tunables`
    written under queue/iosched/: fios' counters, printed after each run, are that workload's
    alone. On a device other than flashsim0 a run's workload is labelled WORKLOAD@DEV. With
    `guest_cpu`, the guest's /proc/stat before and after each run of all the tasks together is
    printed as LABEL/cpu (guest_cpu_per_io reads it)."""
    target = BenchTarget(Path(f"/dev/{dev}"), dev, False, False)
    queue = f"/sys/block/{dev}/queue"
    suffix = "" if dev == "flashsim0" else f"@{dev}"
    files: dict[str, str] = {}
    script = ""
    loaded: set[str] = set()
    for scheduler in schedulers:
        kernel_name = scheduler.split("+")[0]  # "fios+eq1": fios with a variant's tunables
        if kernel_name in LOADABLE and kernel_name not in loaded:
            script += f"insmod /lib/modules/{LOADABLE[kernel_name]}.ko\n"
            loaded.add(kernel_name)
        for workload in workloads:
            script += f"echo none > {queue}/scheduler\necho {kernel_name} > {queue}/scheduler\n"
            for name, value in (tunables or {}).get(scheduler, {}).items():
                script += f"echo {value} > {queue}/iosched/{name}\n"
            timed = workload.model_copy(update={"duration_s": seconds, "warmup_s": 0.3})
            labels = fio_runs(f"{workload.name}{suffix}/{scheduler}", timed, target, files)
            for label, run in labels.items():
                if guest_cpu and label.endswith("/together"):
                    run = f"{GUEST_CPU_BEFORE}{run}{GUEST_CPU_AFTER.format(label=label)}"
                script += run
                if kernel_name == "fios":
                    script += (
                        f"echo BLKPILOT-STATS-BEGIN {label}\ncat {queue}/iosched/stats\n"
                        "echo BLKPILOT-STATS-END\n"
                    )
    return script, files


GUEST_USER_HZ = 100  # Debian's kernels
# the guest's CPU time over a run: its "cpu" and "ctxt" lines of /proc/stat before and after
GUEST_CPU_BEFORE = 'before=$(head -1 /proc/stat)\nbefore_ctxt=$(grep "^ctxt " /proc/stat)\n'
GUEST_CPU_AFTER = (
    "echo BLKPILOT-STATS-BEGIN {label}/cpu\n"
    'echo "before $before"\necho "before_ctxt $before_ctxt"\n'
    'echo "after $(head -1 /proc/stat)"\necho "after_ctxt $(grep "^ctxt " /proc/stat)"\n'
    "echo BLKPILOT-STATS-END\n"
)
# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal (in USER_HZ ticks)
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def guest_cpu_per_io(counters: dict[str, str], ios: float) -> dict[str, float]:
    """Where a run's guest CPU went, per I/O completed by all its tasks: the guest's busy
    share (busy over busy and idle, every vCPU), its busy µs per I/O — user, system, and
    interrupts with softirqs apart — and its context switches per I/O. Where the device's
    time is the guest's CPU (null_blk), a scheduler that costs more per request shows a
    higher busy µs per I/O at the same busy share; one that holds work back while the CPU
    could run it shows a lower busy share."""
    if not {"before", "after"} <= counters.keys() or ios <= 0:
        return {}
    # busy, total and switches as the agent's collector reads /proc/stat; the split apart
    first, last = (
        parse_stat(f"{counters[k]}\n{counters.get(f'{k}_ctxt', '')}") for k in ("before", "after")
    )
    busy, total = last.busy_ticks - first.busy_ticks, last.total_ticks - first.total_ticks
    if total <= 0:
        return {}
    ticks = {
        field: int(after) - int(before)
        for field, before, after in zip(
            STAT_FIELDS,
            counters["before"].split()[1:9],
            counters["after"].split()[1:9],
            strict=True,
        )
    }
    us = 1e6 / GUEST_USER_HZ / ios
    out = {
        "busy_share": round(busy / total, 3),
        "busy_us_per_io": round(busy * us, 1),
        "user_us_per_io": round((ticks["user"] + ticks["nice"]) * us, 1),
        "system_us_per_io": round(ticks["system"] * us, 1),
        "irq_us_per_io": round((ticks["irq"] + ticks["softirq"]) * us, 1),
    }
    if "before_ctxt" in counters and "after_ctxt" in counters:
        out["context_switches_per_io"] = round(
            (last.context_switches - first.context_switches) / ios, 2
        )
    return out


def summarize_fairness(parsed: dict[str, fio_jobs.FioResult]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for label, result in parsed.items():
        workload, scheduler, kind = label.split("/")
        if kind != "together":
            continue
        alone = {}
        for task in result.tasks:
            (solo,) = parsed[f"{workload}/{scheduler}/alone-{task.job}"].tasks
            alone[task.job] = Alone(solo.mean_latency_us, solo.iops)
        metrics = fairness(result.tasks, alone)
        summary.setdefault(workload, {})[scheduler] = {
            "worst_slowdown": round(metrics["worst_slowdown"], 2),
            "proportional_slowdown": metrics["proportional_slowdown"],
            "worst_over_proportional": round(metrics["worst_slowdown_over_proportional"], 2),
            "concurrent_efficiency": round(metrics["concurrent_efficiency"], 3),
            "slowdowns": {
                k.removeprefix("slowdown_"): round(v, 2)
                for k, v in metrics.items()
                if k.startswith("slowdown_")
            },
            # the worst task of each job: its p99 and maximum latency, µs
            "latency_us": {
                job: {
                    "p99": round(max(t.p99_us for t in result.tasks if t.job == job), 1),
                    "max": round(max(t.max_us for t in result.tasks if t.job == job), 1),
                }
                for job in dict.fromkeys(t.job for t in result.tasks)
            },
        }
    return summary


POLL_DEVICES = {"ull": 5_000, "flash": 80_000}  # read latency, ns
POLL_MODES = {
    "interrupt": ("0", "-1"),
    "classic": ("1", "-1"),
    "hybrid": ("1", "0"),
}  # hipri, delay


def polling_script(rounds: int, seconds: float) -> tuple[str, dict[str, str]]:
    """HotStorage '22: interrupt vs classic vs hybrid polling, small and large reads, at a
    ULL-like and a flash-like latency, on a device whose polled completions take as long
    as its interrupt-driven ones."""
    script = ""
    for device, read_ns in POLL_DEVICES.items():
        params = f"units=4 read_lat_ns={read_ns} read_ns_per_kb=20 poll_queues=1"
        script += FLASHSIM.format(params=params)
        script += "echo BLKPILOT-IO-POLL $(cat /sys/block/flashsim0/queue/io_poll)\n"
        for r in range(rounds):
            for size in ("4k", "128k"):
                for mode, (hipri, delay) in POLL_MODES.items():
                    script += f"echo {delay} > /sys/block/flashsim0/queue/io_poll_delay\n"
                    script += f"echo BLKPILOT-STEP {device}/{size}/{mode}\n"
                    label = f"{device}/{size}/{mode}/{r}"
                    # the guest's CPU time over the run: what polling spends, for the estimate
                    script += "before=$(head -1 /proc/stat)\n"
                    script += _fio_block(
                        label,
                        f"--name=p --filename=/dev/flashsim0 --direct=1 --ioengine=io_uring"
                        f" --hipri={hipri} --rw=randread --bs={size} --iodepth=1 --time_based"
                        f" --runtime={round(seconds * 1000)}ms --ramp_time=300ms --size=64m",
                    )
                    script += (
                        f'echo BLKPILOT-STATS-BEGIN {label}\necho "before $before"\n'
                        'echo "after $(head -1 /proc/stat)"\necho BLKPILOT-STATS-END\n'
                    )
        script += "rmmod flashsim\ntest -e /sys/block/flashsim0 && echo BLKPILOT-UNLOAD-FAILED\n"
    return script, {}


def estimated_energy(before: str, after: str, iops: float) -> dict[str, float]:
    """The guest CPU's busy share over a run (its /proc/stat "cpu" lines before and after) and
    the energy per I/O that agent.power.CpuPowerModel estimates from it: average power over
    the run divided by its I/O rate. An estimate (scope estimated): it ranks configurations
    by the CPU time they cost, as HotStorage '22 measured with a meter."""
    first, last = parse_stat(before), parse_stat(after)
    busy = (last.busy_ticks - first.busy_ticks) / GUEST_USER_HZ
    total = (last.total_ticks - first.total_ticks) / GUEST_USER_HZ
    if total <= 0 or iops <= 0:
        return {}
    watts = CpuPowerModel().joules(busy, total - busy) / total
    return {"cpu_busy_share": busy / total, "joules_per_mio_estimated": watts / iops * 1e6}


def summarize_polling(
    parsed: dict[str, fio_jobs.FioResult], counters: dict[str, dict[str, str]] | None = None
) -> dict[str, Any]:
    cells: dict[str, list[dict[str, float]]] = {}
    for label, result in parsed.items():
        device, size, mode, _ = label.split("/")
        metrics = dict(result.metrics)
        cpu = (counters or {}).get(label, {})
        if "before" in cpu and "after" in cpu:
            metrics.update(estimated_energy(cpu["before"], cpu["after"], metrics["iops"]))
        cells.setdefault(f"{device}/{size}/{mode}", []).append(metrics)
    wanted = (
        "lat_mean_us",
        "lat_p50_us",
        "iops",
        "context_switches_per_io",
        "cpu_usr_pct",
        "cpu_sys_pct",
        "cpu_busy_share",
        "joules_per_mio_estimated",
    )
    return {
        key: {
            metric: round(statistics.mean(m[metric] for m in runs), 3)
            for metric in wanted
            if all(metric in m for m in runs)
        }
        for key, runs in sorted(cells.items())
    }


@dataclass
class LabResult:
    scenario: str
    kernel: str
    boot_seconds: float
    runs: dict[str, dict[str, float]]  # label -> fio metrics
    parsed: dict[str, fio_jobs.FioResult]
    kernel_problems: list[str]
    summary: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, dict[str, str]] = field(default_factory=dict)  # fios' counters per run
    tunables: dict[str, dict[str, int]] = field(default_factory=dict)  # written per scheduler
    apps: dict[str, str] = field(default_factory=dict)  # an application's output per run
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime = field(default_factory=lambda: datetime.now(UTC))


def _modules(root: Path, trio: packages.KernelTrio, names: list[str]) -> list[Path]:
    found = []
    base = packages.modules_dir(root, trio) / "kernel"
    for name in names:
        (module,) = base.rglob(f"{name}.ko")
        found.append(module)
    return found


def summarize_overhead(runs: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per scheduler the median over rounds of each round's mean and median latency; the
    ratios to none use the medians of means (robust to one round disturbed by the host)."""
    schedulers = sorted({label.split("/")[0] for label in runs}, key=_scheduler_order)
    mean = {
        s: statistics.median(
            m["lat_mean_us"] for label, m in runs.items() if label.startswith(f"{s}/")
        )
        for s in schedulers
    }
    p50 = {
        s: statistics.median(
            m["lat_p50_us"] for label, m in runs.items() if label.startswith(f"{s}/")
        )
        for s in schedulers
    }
    rounds = sorted({label.split("/")[1] for label in runs})
    added = {
        s: statistics.median(
            runs[f"{s}/{r}"]["lat_mean_us"] / runs[f"none/{r}"]["lat_mean_us"] - 1 for r in rounds
        )
        for s in schedulers
    }
    summary: dict[str, Any] = {
        "mean_latency_us": {s: round(v, 2) for s, v in mean.items()},
        "p50_latency_us": {s: round(v, 2) for s, v in p50.items()},
        "relative_to_none": {s: round(mean[s] / mean["none"], 3) for s in schedulers},
        # per round, each scheduler's added latency over none in that round; the median
        "added_over_none_per_round": {s: round(v, 3) for s, v in added.items()},
    }
    for other in ("mq-deadline", "bfq"):
        if {"fios", other} <= set(schedulers) and len(rounds) >= 3:
            differences = [
                (runs[f"fios/{r}"]["lat_mean_us"] - runs[f"{other}/{r}"]["lat_mean_us"])
                / runs[f"none/{r}"]["lat_mean_us"]
                for r in rounds
            ]
            key = "fios_minus_" + other.replace("-", "_")
            summary[key] = paired_difference(differences)
    return summary


def paired_difference(differences: list[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean of per-round differences (as fractions of that round's none) with Student's t
    interval: the rounds pair the schedulers in time, so the host's drift between rounds
    cancels out of each difference."""
    n = len(differences)
    mean = statistics.fmean(differences)
    sem = statistics.stdev(differences) / math.sqrt(n)
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sem
    return {
        "rounds": n,
        "mean": round(mean, 4),
        "low": round(mean - half, 4),
        "high": round(mean + half, 4),
        "confidence": confidence,
        "per_round": [round(d, 4) for d in differences],
    }


def _scheduler_order(name: str) -> int:
    return SCHEDULERS.index(name) if name in SCHEDULERS else len(SCHEDULERS)


Tunables = dict[str, dict[str, int]]  # scheduler label -> queue/iosched/ values
# the Tunables key of fios' costs calibrated on null_blk (Scenario.calibrate_null)
NULL_CALIBRATED = "fios@nullb0"


@dataclass(frozen=True)
class Scenario:
    modules: list[str]  # from the Debian kernel
    ours: list[str]  # built from kernel/
    script: Callable[[int, float, Tunables], tuple[str, dict[str, str]]]
    summarize: Callable[[dict[str, fio_jobs.FioResult]], dict[str, Any]]
    calibrate: bool = False  # boot once first to measure fios' costs on flashsim
    # summarize with the guest's STATS blocks too (label -> key -> value)
    summarize_stats: (
        Callable[[dict[str, fio_jobs.FioResult], dict[str, dict[str, str]]], dict[str, Any]] | None
    ) = None
    cpus: int = 1  # the guest's vCPUs
    flash_params: str = FLASH_LIKE  # flashsim's, for the calibration boot too
    # with calibrate: null_blk with this many hardware queues calibrated too (0: not)
    calibrate_null: int = 0
    # guest seconds spent after each run per second of run (null-hooks reduces its trace)
    after_run: float = 0.0
    binaries: tuple[str, ...] = ("fio",)  # programs the guest runs, with their libraries
    # summarize with the applications' own output too (label -> what it printed)
    summarize_apps: (
        Callable[[dict[str, fio_jobs.FioResult], dict[str, str]], dict[str, Any]] | None
    ) = None


def _overhead(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
    return null_overhead_script(rounds, seconds), {}


def _polling(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
    return polling_script(rounds, seconds)


# fios as the agent configures it (calibrated costs, alpha 0.5), and variants on top of that:
# without anticipation (alpha 0), without read preference / write blocking (the paper makes it
# optional), and without calibration (costs 0: elapsed time / parallelism, equation 1).
FIOS_VARIANTS: dict[str, dict[str, int]] = {
    "fios+noantic": {"alpha_permille": 0},
    "fios+norp": {"read_preference": 0},
    "fios+eq1": {name: 0 for name in calibrate.POINTS},
}
FAIRNESS_SCHEDULERS = (*SCHEDULERS, *FIOS_VARIANTS)


def _fairness(
    workloads: list[str], schedulers: tuple[str, ...] = FAIRNESS_SCHEDULERS
) -> Callable[[int, float, Tunables], tuple[str, dict[str, str]]]:
    def make(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
        chosen = [w for w in fios() if w.name in workloads]
        calibrated = tunables.get("fios", {})
        tunables = {
            **tunables,
            **{name: {**calibrated, **extra} for name, extra in FIOS_VARIANTS.items()},
        }
        script, files = fairness_files(chosen, schedulers, seconds, tunables)
        # back to none, then unload both modules: they must leave cleanly
        unload = "echo none > /sys/block/flashsim0/queue/scheduler\nrmmod fios\nrmmod flashsim\n"
        unload += "test -e /sys/block/flashsim0 && echo BLKPILOT-UNLOAD-FAILED\n"
        unload += "test -e /sys/module/fios && echo BLKPILOT-UNLOAD-FAILED\n"
        return FLASHSIM.format(params=FLASH_LIKE) + script + unload, files

    return make


SMP_DEVICES = {
    # null_blk and flashsim with one submission queue per vCPU
    "nullb0": "insmod /lib/modules/null_blk.ko queue_mode=2 irqmode=2 completion_nsec=10000"
    " memory_backed=1 gb=1 submit_queues={cpus} poll_queues=0 hw_queue_depth=64\n",
    "flashsim0": "insmod /lib/modules/flashsim.ko " + FLASH_LIKE + " submit_queues={cpus}\n",
}
# null_blk's costs as a calibration would find them: reads and writes alike (ns)
NULL_COSTS = {"cost_read_4k_ns": 20_000, "cost_read_128k_ns": 40_000,
              "cost_write_4k_ns": 20_000, "cost_write_128k_ns": 40_000}  # fmt: skip
# readers at QD1, a large-read reader and writers with deep queues, one process each (the
# guest spreads them over its vCPUs, so requests arrive on every hardware queue)
MIXED = (
    "--direct=1 --time_based --runtime={ms}ms --size=64m --filename=/dev/{dev}"
    " --name=read4k --rw=randread --bs=4k --ioengine=psync --numjobs=2"
    " --name=read128k --rw=randread --bs=128k --ioengine=psync"
    " --name=write --rw=randwrite --bs=4k --ioengine=libaio --iodepth=16 --numjobs=2"
)
# writers that would take every scheduler tag, against one synchronous reader
DEPTH = (
    "--direct=1 --time_based --runtime={ms}ms --size=64m --filename=/dev/flashsim0"
    " --name=read --rw=randread --bs=4k --ioengine=psync"
    " --name=write --rw=randwrite --bs=4k --ioengine=libaio --iodepth=128 --numjobs=2"
)


def _state(label: str, dev: str, extra: str = "") -> str:
    """The device's state after a run, as a STATS block: what is still in flight (a lost
    request stays there), its hardware queues."""
    return (
        f"echo BLKPILOT-STATS-BEGIN {label}\n"
        f'echo "inflight $(cat /sys/block/{dev}/inflight)"\n'
        f'echo "hw_queues $(ls /sys/block/{dev}/mq | wc -l)"\n'
        f"{extra}echo BLKPILOT-STATS-END\n"
    )


# the depth runs: async_depth at its default and at nr_requests (no limit)
DEPTH_SETTINGS = ("default", "off")
# then one writer alone, in the idle class (weight 1: a quarter slice), with the shortest
# slice fios allows (100 us) and no cost model: a write's charge (elapsed / parallelism, at
# most a timeslice) is then up to four of its slices, and each write in flight when its slice
# runs out is charged too, so it ends every slice owing more than the next one gives. fios
# must then start two epochs at once (`debt_epochs`) — or, once its writes in flight are done,
# wait with nothing in flight for an insert that never comes while its queued writes hold
# every tag it may take: the stall once seen on two vCPUs in the depth runs
DEBT = (
    "--direct=1 --time_based --runtime={ms}ms --size=64m --filename=/dev/flashsim0"
    " --name=write --rw=randwrite --bs=4k --ioengine=libaio --iodepth=128 --prioclass=3"
)


def depth_script(seconds: float) -> str:
    """fios' depth limit: a synchronous reader against writers (QD 128 each) that would take
    every scheduler tag, for each of DEPTH_SETTINGS; fios' stats after each run."""
    ms = round(seconds * 1000)
    queue = "/sys/block/flashsim0/queue"
    script = ""
    for setting in (*DEPTH_SETTINGS, "debt"):
        script += f"echo none > {queue}/scheduler\necho fios > {queue}/scheduler\n"
        if setting == "off":
            script += f"cat {queue}/nr_requests > {queue}/iosched/async_depth\n"
        if setting == "debt":
            script += f"echo 100 > {queue}/iosched/timeslice_us\n"
        label = f"depth/{setting}"
        script += _fio_block(label, (DEBT if setting == "debt" else DEPTH).format(ms=max(ms, 1500)))
        script += _state(
            label,
            "flashsim0",
            f'echo "async_depth $(cat {queue}/iosched/async_depth)"\n'
            f'echo "nr_requests $(cat {queue}/nr_requests)"\n'
            f"sed 's/^/fios_/' {queue}/iosched/stats\n",
        )

    return script


def smp_script(cpus: int, seconds: float) -> tuple[str, dict[str, str]]:
    """Every scheduler on null_blk and flashsim with one hardware queue per vCPU, under mixed
    readers and deep-queued writers; then fios' life cycle on flashsim: switched with
    mq-deadline under load, rmmod while attached, fio killed while fios anticipates for it;
    then the depth limit's runs (depth_script), as on one vCPU ("flash-depth")."""
    ms = round(seconds * 1000)
    queue = "/sys/block/flashsim0/queue"
    script = (
        "mount -t debugfs none /sys/kernel/debug 2>/dev/null\ninsmod /lib/modules/configfs.ko\n"
    )
    script += "".join(line.format(cpus=cpus) for line in SMP_DEVICES.values())
    script += "".join(f"insmod /lib/modules/{LOADABLE[s]}.ko\n" for s in LOADABLE)
    for dev in SMP_DEVICES:
        for scheduler in SCHEDULERS:
            script += f"echo {scheduler} > /sys/block/{dev}/queue/scheduler\n"
            if scheduler == "fios" and dev == "nullb0":
                # null_blk calibrated as it is: a write costs what a read does (flashsim
                # stays uncalibrated: read preference then holds, the paper's)
                script += "".join(
                    f"echo {ns} > /sys/block/{dev}/queue/iosched/{name}\n"
                    for name, ns in NULL_COSTS.items()
                )
            label = f"{dev}/{scheduler}"
            script += _fio_block(label, MIXED.format(ms=ms, dev=dev))
            # fios: whether read preference held (by the calibrated costs), and whether it
            # anticipated (only where reads go first)
            found = (
                f"grep -E '^reads_first ' /sys/kernel/debug/block/{dev}/sched/state\n"
                f"grep -E '^anticipations ' /sys/block/{dev}/queue/iosched/stats\n"
                if scheduler == "fios"
                else ""
            )
            script += _state(label, dev, found)
        script += f"echo none > /sys/block/{dev}/queue/scheduler\n"

    # switched under load, twenty times each way
    script += f"echo mq-deadline > {queue}/scheduler\n"
    script += (
        "fio --eta=never --output-format=json+ --output=/tmp/out.json --randrepeat=0"
        " --lat_percentiles=1 --clat_percentiles=0"
        f" --norandommap {MIXED.format(ms=max(ms * 3, 2000), dev='flashsim0')} &\n"
        "pid=$!\nusleep 200000\nswitches=0\n"
        "while [ $switches -lt 20 ]; do\n"
        f"  echo fios > {queue}/scheduler && usleep 30000 &&"
        f" echo mq-deadline > {queue}/scheduler && switches=$((switches + 1))\n"
        "  usleep 30000\ndone\nwait $pid\nfio_exit=$?\n"
        "echo BLKPILOT-RESULT-BEGIN lifecycle/switching\ncat /tmp/out.json\n"
        "echo BLKPILOT-RESULT-END\n"
    )
    script += _state(
        "lifecycle/switching", "flashsim0", 'echo "switches $switches"\necho "fio_exit $fio_exit"\n'
    )

    # rmmod while attached must be refused, and fios keep serving
    script += f"echo fios > {queue}/scheduler\n"
    script += "rmmod fios 2>/dev/null; rmmod_attached=$?\n"
    script += _fio_block("lifecycle/after-rmmod", MIXED.format(ms=ms, dev="flashsim0"))
    script += _state(
        "lifecycle/after-rmmod",
        "flashsim0",
        f'echo "rmmod_attached_exit $rmmod_attached"\necho "scheduler $(cat {queue}/scheduler)"\n',
    )

    # fio killed while a reader with think time is anticipated
    script += (
        "fio --eta=never --output=/dev/null --direct=1 --time_based --runtime=20s --size=64m"
        " --filename=/dev/flashsim0 --name=r --rw=randread --bs=4k --ioengine=psync"
        " --thinktime=200 --name=w --rw=randwrite --bs=4k --ioengine=psync &\n"
        f"pid=$!\nusleep {max(ms, 1000) * 1000}\n"
        f"antic_before=$(grep '^anticipations ' {queue}/iosched/stats)\n"
        "killall -9 fio\nwait $pid\nusleep 100000\n"
    )
    script += _state(
        "lifecycle/killed",
        "flashsim0",
        f"echo \"before_kill $antic_before\"\ncat {queue}/iosched/stats | sed 's/^/fios_/'\n",
    )
    script += _fio_block("lifecycle/after-kill", MIXED.format(ms=ms, dev="flashsim0"))
    script += _state("lifecycle/after-kill", "flashsim0")

    script += depth_script(seconds)
    script += f"echo none > {queue}/scheduler\nrmmod fios\n"
    script += "test -e /sys/module/fios && echo BLKPILOT-UNLOAD-FAILED\n"
    script += "rmmod flashsim\ntest -e /sys/block/flashsim0 && echo BLKPILOT-UNLOAD-FAILED\n"
    return script, {}


def summarize_smp(
    parsed: dict[str, fio_jobs.FioResult], states: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """Per run: I/Os done, what stayed in flight, hardware queues; the life cycle's
    outcomes; the depth limit's reader latency with and without it."""
    runs = {}
    for label, state in states.items():
        result = parsed.get(label)
        runs[label] = {
            "inflight": [int(v) for v in state.get("inflight", "-1 -1").split()],
            "hw_queues": int(state.get("hw_queues", "0")),
            # fio's JSON was read back (a job that failed makes parse raise)
            "ios": sum(t.ios for t in result.tasks) if result else 0,
            **{k: v for k, v in state.items() if k not in ("inflight", "hw_queues")},
        }
    depth = {}
    for setting in DEPTH_SETTINGS:
        result = parsed.get(f"depth/{setting}")
        if result is not None:
            (reader,) = [t for t in result.tasks if t.job == "read"]
            depth[setting] = {
                "reader_mean_us": round(reader.mean_latency_us, 1),
                "reader_p99_us": round(reader.p99_us, 1),
                "reader_iops": round(reader.iops, 1),
                "writer_iops": round(sum(t.iops for t in result.tasks if t.job == "write"), 1),
            }
    return {"runs": runs, "depth": depth}


def _smp(cpus: int) -> Callable[[int, float, Tunables], tuple[str, dict[str, str]]]:
    def make(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
        return smp_script(cpus, seconds)

    return make


# fios' own check of a calibration (fios_cost_problem): costs written one at a time, falling
# with size for writes, then rising; its stats say which model it charges by
COST_CHECKS = {
    "costs/falling": {"cost_read_4k_ns": 300_000, "cost_read_128k_ns": 400_000,
                      "cost_write_4k_ns": 4_000_000, "cost_write_128k_ns": 1_000_000},
    "costs/rising": {"cost_write_128k_ns": 5_000_000},
}  # fmt: skip


def cost_check_script() -> str:
    queue = "/sys/block/flashsim0/queue"
    script = f"echo none > {queue}/scheduler\necho fios > {queue}/scheduler\n"
    for label, costs in COST_CHECKS.items():
        script += "".join(f"echo {v} > {queue}/iosched/{k}\n" for k, v in costs.items())
        script += (
            f"echo BLKPILOT-STATS-BEGIN {label}\ngrep ^cost_model {queue}/iosched/stats\n"
            "echo BLKPILOT-STATS-END\n"
        )
    return script


def _depth(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
    queue = "/sys/block/flashsim0/queue"
    script = FLASHSIM.format(params=FLASH_LIKE) + "insmod /lib/modules/fios.ko\n"
    script += depth_script(seconds) + cost_check_script()
    script += f"echo none > {queue}/scheduler\nrmmod fios\nrmmod flashsim\n"
    script += "test -e /sys/module/fios && echo BLKPILOT-UNLOAD-FAILED\n"
    return script, {}


# fios' slice in the review scenarios: the paper's 100 ms would give a 4 + 4 run one epoch per
# 0.8 s of device time; 20 ms keeps a write's 4 ms a fifth of a writer's slice and gives runs of
# a few seconds dozens of epochs (each run's count is in its stats)
REVIEW_TIMESLICE_US = 20_000
WEIGHTS = {"heavy": 0, "light": 4}  # best-effort levels: weights 8 and 4, 2:1
WEIGHT_SCHEDULERS = ("none", "bfq", "fios")  # none ignores priorities; bfq weighs by them


def weights_script(seconds: float, schedulers: tuple[str, ...] = WEIGHT_SCHEDULERS) -> str:
    """Two identical writers (4 KB random, QD1; a write takes every unit, so device time is
    shared by turns) at best-effort levels 0 and 4: device time should follow 2:1."""
    queue = "/sys/block/flashsim0/queue"
    jobs = " ".join(
        f"--name={name} --rw=randwrite --bs=4k --ioengine=psync --prioclass=2 --prio={level}"
        for name, level in WEIGHTS.items()
    )
    script = ""
    for scheduler in schedulers:
        script += f"echo none > {queue}/scheduler\necho {scheduler} > {queue}/scheduler\n"
        if scheduler == "fios":
            script += f"echo {REVIEW_TIMESLICE_US} > {queue}/iosched/timeslice_us\n"
        script += _fio_block(
            f"weights/{scheduler}",
            f"--direct=1 --time_based --runtime={round(seconds * 1000)}ms --size=64m"
            f" --filename=/dev/flashsim0 {jobs}",
        )
    return script


# cgroup v2 weights: fios' own io.fios.weight (its blkcg policy), bfq's io.bfq.weight; none
# ignores both. 200 against 100, as io.weight would be set
CGROUP_WEIGHTS = {"heavy": 200, "light": 100}
CGROUP_WEIGHT_FILES = {"bfq": "io.bfq.weight", "fios": "io.fios.weight"}
CGROUP = "/sys/fs/cgroup"

# a value just out of each fios tunable's range (kernel/README.md): refused with EINVAL
FIOS_OUT_OF_RANGE = {
    "alpha_permille": 991,
    "timeslice_us": 99,
    "read_preference": 3,
    "max_depth": 0,
    "write_depth": 257,
    "weigh_idle": 2,
    "lend_permille": 10001,
    "async_depth": 100000,
    "cost_read_4k_ns": 100000001,
}


def cgroup_weights_script(seconds: float, schedulers: tuple[str, ...] = WEIGHT_SCHEDULERS) -> str:
    """The two writers of weights_script at the same I/O priority, each in its own cgroup
    (v2, io controller on) weighing 200 and 100: device time should follow 2:1. Each is its
    own fio (a process joins a cgroup), started together."""
    queue = "/sys/block/flashsim0/queue"
    ms = round(seconds * 1000)
    script = (
        f"mkdir -p {CGROUP}\nmount -t cgroup2 none {CGROUP}\n"
        f"echo +io > {CGROUP}/cgroup.subtree_control\n"
        + "".join(f"mkdir {CGROUP}/{name}\n" for name in CGROUP_WEIGHTS)
    )
    for scheduler in schedulers:
        script += f"echo none > {queue}/scheduler\necho {scheduler} > {queue}/scheduler\n"
        if scheduler == "fios":
            script += f"echo {REVIEW_TIMESLICE_US} > {queue}/iosched/timeslice_us\n"
        weight_file = CGROUP_WEIGHT_FILES.get(scheduler)
        label = f"cgroup-weights/{scheduler}"
        if weight_file:
            script += "".join(
                f"echo {weight} > {CGROUP}/{name}/{weight_file}\n"
                for name, weight in CGROUP_WEIGHTS.items()
            )
        for name in CGROUP_WEIGHTS:
            script += (
                f"sh -c 'echo $$ > {CGROUP}/{name}/cgroup.procs && exec fio --eta=never"
                f" --output-format=json+ --output=/tmp/{name}.json --randrepeat=0"
                " --lat_percentiles=1 --clat_percentiles=0 --norandommap --direct=1"
                f" --time_based --runtime={ms}ms --size=64m --filename=/dev/flashsim0"
                f" --name={name} --rw=randwrite --bs=4k --ioengine=psync' &\n"
            )
        script += "wait\n"
        for name in CGROUP_WEIGHTS:
            script += (
                f"echo BLKPILOT-RESULT-BEGIN {label}/{name}\ncat /tmp/{name}.json\n"
                "echo BLKPILOT-RESULT-END\n"
            )
        script += f"echo BLKPILOT-STATS-BEGIN {label}\n"
        if scheduler == "fios":
            # bad input is refused and changes nothing: out of range, not a number, a device
            light = f"{CGROUP}/light/{weight_file}"
            script += "".join(
                f'echo "{value}" > {light} 2>/dev/null; echo "bad_{i}_exit $?"\n'
                for i, value in enumerate(("0", "10001", "heavy", "253:0 300"))
            )
            # a tunable out of its range is refused (EINVAL) and keeps its value; one in range
            # (its own value, written again) is taken
            iosched = f"{queue}/iosched"
            for name, bad in FIOS_OUT_OF_RANGE.items():
                script += (
                    f"before=$(cat {iosched}/{name}); echo {bad} > {iosched}/{name} 2>/dev/null;"
                    f' echo "tunable_{name}_exit $?"; [ "$(cat {iosched}/{name})" = "$before" ]'
                    f' && echo "tunable_{name}_kept 1" || echo "tunable_{name}_kept 0"\n'
                    f'echo "$before" > {iosched}/{name}; echo "tunable_{name}_rewritten_exit $?"\n'
                )
            # costs far below what flashsim takes: a read alone on the device is counted as
            # drift (stats cost_drift), and debugfs shows the measured over calibrated ratio
            costs = (
                "cost_read_128k_ns",
                "cost_read_4k_ns",
                "cost_write_128k_ns",
                "cost_write_4k_ns",
            )
            low = {
                "cost_read_128k_ns": 2000,
                "cost_read_4k_ns": 1000,
                "cost_write_128k_ns": 8000,
                "cost_write_4k_ns": 4000,
            }
            script += "mount -t debugfs none /sys/kernel/debug 2>/dev/null\n"
            script += "".join(f"saved_{c}=$(cat {iosched}/{c})\n" for c in costs)
            script += f'echo "drift_before $(grep ^cost_drift {iosched}/stats | cut -d" " -f2)"\n'
            script += "".join(f"echo {low[c]} > {iosched}/{c}\n" for c in costs)
            script += (
                "fio --eta=never --output=/dev/null --name=drift --filename=/dev/flashsim0"
                " --rw=randread --bs=4k --direct=1 --ioengine=psync --time_based"
                " --runtime=1000ms --size=64m\n"
                f'echo "drift_after $(grep ^cost_drift {iosched}/stats | cut -d" " -f2)"\n'
                'echo "drift_read_x256 $(grep ^measured_over_calibrated_x256'
                ' /sys/kernel/debug/block/flashsim0/sched/state | cut -d" " -f2)"\n'
            )
            script += "".join(f"echo $saved_{c} > {iosched}/{c}\n" for c in reversed(costs))
        if weight_file:
            script += "".join(
                f'echo "{name}_weight $(cat {CGROUP}/{name}/{weight_file})"\n'
                for name in CGROUP_WEIGHTS
            )
        script += "echo BLKPILOT-STATS-END\n"
    return script


CHURN_SCHEDULERS = ("mq-deadline", "fios")


def churn_script(seconds: float, schedulers: tuple[str, ...] = CHURN_SCHEDULERS) -> str:
    """One writer alone, then the same writer while short-lived readers (each a new process
    reading for 50 ms) are started one after another for as long as it runs: how much of its
    own throughput the writer keeps, and how many readers ran."""
    queue = "/sys/block/flashsim0/queue"
    ms = round(seconds * 1000)
    writer = (
        "--direct=1 --time_based --size=64m --filename=/dev/flashsim0"
        " --name=writer --rw=randwrite --bs=4k --ioengine=psync"
    )
    reader = (
        "fio --eta=never --output=/dev/null --direct=1 --time_based --runtime=50ms --size=64m"
        " --filename=/dev/flashsim0 --name=reader --rw=randread --bs=4k --ioengine=psync"
    )
    script = ""
    for scheduler in schedulers:
        script += f"echo none > {queue}/scheduler\necho {scheduler} > {queue}/scheduler\n"
        if scheduler == "fios":
            script += f"echo {REVIEW_TIMESLICE_US} > {queue}/iosched/timeslice_us\n"
        script += _fio_block(f"churn/{scheduler}/alone", f"{writer} --runtime={ms}ms")
        script += (
            "fio --eta=never --output-format=json+ --output=/tmp/out.json --randrepeat=0"
            " --lat_percentiles=1 --clat_percentiles=0"
            f" --norandommap {writer} --runtime={ms}ms &\npid=$!\nreaders=0\n"
            "while kill -0 $pid 2>/dev/null; do\n"
            f"  {reader} && readers=$((readers + 1))\ndone\nwait $pid\n"
            f"echo BLKPILOT-RESULT-BEGIN churn/{scheduler}/together\ncat /tmp/out.json\n"
            "echo BLKPILOT-RESULT-END\n"
            f'echo BLKPILOT-STATS-BEGIN churn/{scheduler}/together\necho "readers $readers"\n'
        )
        if scheduler == "fios":
            script += f"cat {queue}/iosched/stats\n" + ICQS_RELEASED
        script += "echo BLKPILOT-STATS-END\n"
    return script


# every reader (and the writer) has exited: their io_cqs are released (by a work item, once
# the io_context's last reference goes) — up to 2 s allowed; left: a reference leaked
ICQS_RELEASED = (
    "mount -t debugfs none /sys/kernel/debug 2>/dev/null\n"
    "state=/sys/kernel/debug/block/flashsim0/sched/state\ntries=0\n"
    "while [ $tries -lt 40 ] && ! grep -q '^io_cqs 0 ' $state; do\n"
    "  usleep 50000; tries=$((tries + 1))\ndone\n"
    "grep '^io_cqs' $state | awk '{print \"io_cqs_left\", $2; print \"pinned_left\", $4}'\n"
)


def observe_script(seconds: float) -> str:
    """fios' debugfs and trace messages under readers with think time and writers: its state
    and tasks read in the middle of the run, and the messages it left in the kernel's blk
    tracer (epochs, anticipations begun and ended, slices spent) counted against its stats."""
    queue = "/sys/block/flashsim0/queue"
    sched = "/sys/kernel/debug/block/flashsim0/sched"
    tracing = "/sys/kernel/tracing"
    ms = max(round(seconds * 1000), 1000)
    return (
        "mount -t debugfs none /sys/kernel/debug 2>/dev/null\n"
        f"mount -t tracefs none {tracing} 2>/dev/null\n"
        f"echo none > {queue}/scheduler\necho fios > {queue}/scheduler\n"
        f"echo {REVIEW_TIMESLICE_US} > {queue}/iosched/timeslice_us\n"
        f"echo 4096 > {tracing}/buffer_size_kb\necho blk > {tracing}/current_tracer\n"
        # messages only: 1 s of every request's events would overrun the buffer
        "echo notify > /sys/block/flashsim0/trace/act_mask\n"
        "echo 1 > /sys/block/flashsim0/trace/enable\n"
        "fio --eta=never --output=/dev/null --direct=1 --time_based"
        f" --runtime={ms}ms --size=64m --filename=/dev/flashsim0"
        " --name=reader --rw=randread --bs=4k --ioengine=psync --thinktime=258 --numjobs=2"
        " --name=writer --rw=randwrite --bs=4k --ioengine=psync --numjobs=2 &\n"
        # fio takes a while to start under TCG: read the state once its tasks are queueing
        f"pid=$!\ntries=0\nwhile [ $tries -lt 100 ] && [ ! -s /tmp/tasks ]; do\n"
        f"  usleep 20000; cat {sched}/tasks > /tmp/tasks; tries=$((tries + 1))\ndone\n"
        f"usleep {ms * 200}\n"
        f"cat {sched}/state > /tmp/state\ncat {sched}/tasks > /tmp/tasks\n"
        "wait $pid\necho 0 > /sys/block/flashsim0/trace/enable\n"
        f"cat {tracing}/trace > /tmp/trace\necho nop > {tracing}/current_tracer\n"
        "echo BLKPILOT-STATS-BEGIN observe/fios\n"
        "sed 's/^/state_/' /tmp/state\n"
        "awk '{print \"task\" NR, $0}' /tmp/tasks\n"
        f"cat {queue}/iosched/stats\n"
        f'echo "trace_lines $(grep -c . /tmp/trace)"\n'
        + "".join(
            f"echo \"trace_{key} $(grep -c 'fios {text}' /tmp/trace)\"\n"
            for key, text in TRACE_MESSAGES.items()
        )
        + "grep -m 3 'fios ' /tmp/trace | awk '{print \"sample\" NR, $0}'\n"
        "echo BLKPILOT-STATS-END\n"
    )


# fios' trace messages (blk_add_trace_msg) by what the stats count of the same events
TRACE_MESSAGES = {
    "epochs": "epoch ",
    "anticipations": "antic pid ",
    "anticipation_ends": "antic end ",
    "anticipation_hits": "antic end pid [0-9]* hit",
    "spent": "spent ",
}


REVIEW_WORKLOADS = (
    "fios-4r4w-think",
    "fios-4k-vs-128k",
    "fios-deep-writers",
    "fios-1r-think1ms-4w",
    "fios-1r7w",
)
REVIEW_SCHEDULERS = ("none", "mq-deadline", "bfq", "fios")
# on multi-queue null_blk, fios beside the two schedulers it is weighed against
REVIEW_NULL_SCHEDULERS = ("none", "mq-deadline", "fios")
# fios as the paper has it (no weigh_idle: every read with slice left is waited for) on the
# cases weighing the idle time changes, and on the 1 ms thinker also with write_depth lifted
# (what the reader that is not waited for finds ahead of its next read)
REVIEW_VARIANTS: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {
    "fios+paper": (
        {"weigh_idle": 0},
        ("fios-1r-think1ms-4w", "fios-deep-writers", "fios-1r7w"),
    ),
    "fios+nowd": ({"write_depth": 0}, ("fios-1r-think1ms-4w",)),
    # without lending (the paper's: a spent task waits however little the others use)
    "fios+nolend": ({"lend_permille": 0}, ("fios-4k-vs-128k", "fios-1r7w")),
}


def _review(
    workloads: tuple[str, ...],
    schedulers: tuple[str, ...],
    variants: dict[str, tuple[dict[str, int], tuple[str, ...]]] = REVIEW_VARIANTS,
    flash: str = FLASH_STRIPED,
    null_queues: int = 0,
    null_costs: dict[str, int] | None = None,
) -> Callable[[int, float, Tunables], tuple[str, dict[str, str]]]:
    """The workloads under each scheduler on flashsim (`flash`: its parameters), then each of
    fios' `variants` (its tunables over the review's, and the workloads it runs) — then
    weights, churn and fios observed. With `null_queues`, the workloads again on null_blk with
    that many hardware queues (REVIEW_NULL_SCHEDULERS; fios with `null_costs`, else with the
    costs the calibration boot found there — Scenario.calibrate_null — else uncalibrated: its
    charge then the time on the device over the parallelism, equation 1)."""

    def make(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
        chosen = [w for w in fios() if w.name in workloads]
        review = {**tunables.get("fios", {}), "timeslice_us": REVIEW_TIMESLICE_US}
        tunables = {
            **tunables,
            "fios": review,
            **{name: {**review, **extra} for name, (extra, _) in variants.items()},
        }
        script, files = fairness_files(chosen, schedulers, seconds, tunables)
        for name, (_, names) in variants.items():
            on = [w for w in chosen if w.name in names]
            more, more_files = fairness_files(on, (name,), seconds, tunables)
            script += more.replace("insmod /lib/modules/fios.ko\n", "")
            files.update(more_files)
        script = "insmod /lib/modules/bfq.ko\n" + script.replace("insmod /lib/modules/bfq.ko\n", "")
        script += weights_script(seconds) + cgroup_weights_script(seconds)
        script += churn_script(seconds) + observe_script(seconds)
        unload = "echo none > /sys/block/flashsim0/queue/scheduler\n"
        if null_queues:
            # calibrated as the agent would a scratch null_blk (in the calibration boot),
            # else as given, else uncalibrated
            null_fios = {k: v for k, v in review.items() if k not in calibrate.POINTS}
            costs = null_costs or {
                k: v for k, v in tunables.get(NULL_CALIBRATED, {}).items() if k in calibrate.POINTS
            }
            null_tunables = {"fios": {**null_fios, **costs}}
            more, more_files = fairness_files(
                chosen, REVIEW_NULL_SCHEDULERS, seconds, null_tunables, dev="nullb0"
            )
            script += (
                "insmod /lib/modules/configfs.ko\n"
                + SMP_DEVICES["nullb0"].format(cpus=null_queues)
                + more.replace("insmod /lib/modules/fios.ko\n", "")
                + "echo none > /sys/block/nullb0/queue/scheduler\n"
            )
            files.update(more_files)
        unload += "rmmod fios\nrmmod flashsim\n"
        unload += "test -e /sys/block/flashsim0 && echo BLKPILOT-UNLOAD-FAILED\n"
        unload += "test -e /sys/module/fios && echo BLKPILOT-UNLOAD-FAILED\n"
        return FLASHSIM.format(params=flash) + script + unload, files

    return make


# fios' concurrent efficiency against mq-deadline's on multi-queue devices, run again and
# again (issue 36, item 1): one run's efficiency swings by 10-40 % under TCG (mq-deadline's on
# 4r4w-think@nullb0 read 1.63, 1.74 and 2.81 in three runs of lab_fios_review_cpus2), so the
# two are alternated round by round — mq-deadline first in even rounds, fios first in odd —
# and compared by the rounds' paired ratios
EFFICIENCY_SCHEDULERS = ("mq-deadline", "fios")


def round_label(scheduler: str, index: int) -> str:
    """`scheduler` in round `index`, as a result label's scheduler part (fairness_files reads
    the kernel's name before the "+")."""
    return f"{scheduler}+r{index}"


EFFICIENCY_DEVICES = ("flashsim0", "nullb0")


def efficiency_cases(cases: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The review's cases named as the efficiency summary names them (`1r7w`: flashsim,
    `1r7w@nullb0`: null_blk) as the workloads and devices to run (every workload named, on
    every device named); ValueError for a case the review does not have."""
    names = [f"fios-{case.partition('@')[0]}" for case in cases]
    devices = [case.partition("@")[2] or "flashsim0" for case in cases]
    unknown = [
        case
        for case, name, dev in zip(cases, names, devices, strict=True)
        if name not in REVIEW_WORKLOADS or dev not in EFFICIENCY_DEVICES
    ]
    if unknown or not cases:
        known = [w.removeprefix("fios-") for w in REVIEW_WORKLOADS]
        raise ValueError(
            f"no such case: {', '.join(unknown) or '(none given)'}; the cases are {known},"
            " on flashsim, or with @nullb0"
        )
    return tuple(dict.fromkeys(names)), tuple(d for d in EFFICIENCY_DEVICES if d in devices)


def fios_tunable_names() -> tuple[str, ...]:
    """The tunables fios' module has under queue/iosched/ (its fios_attrs, read from fios.c:
    the one list of them)."""
    source = (build.KERNEL_DIR / "fios" / "fios.c").read_text()
    table = source.partition("fios_attrs[] = {")[2].partition("};")[0]
    return tuple(re.findall(r"FIOS_RW\((\w+)\)", table))


def fios_settings(pairs: list[str]) -> dict[str, int]:
    """NAME=VALUE pairs as fios tunables to write over the calibrated ones; ValueError for a
    name fios does not have or a value that is not a whole number."""
    names = fios_tunable_names()
    settings: dict[str, int] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in names or not re.fullmatch(r"\d+", value.strip()):
            raise ValueError(
                f"not a fios tunable setting: {pair!r} (NAME=VALUE, a whole number; the names:"
                f" {', '.join(names)})"
            )
        settings[name] = int(value)
    return settings


def efficiency_script(
    cpus: int,
    workloads: tuple[str, ...] = REVIEW_WORKLOADS,
    devices: tuple[str, ...] = EFFICIENCY_DEVICES,
    settings: dict[str, int] | None = None,
) -> Callable[[int, float, Tunables], tuple[str, dict[str, str]]]:
    """The review's workloads under mq-deadline and fios (calibrated, the review's slices),
    `rounds` times alternated, on flashsim and on null_blk with a hardware queue per vCPU
    (or those of `workloads` on those of `devices`; fios with `settings` written over its
    tunables on both devices: a variant to try)."""

    def make(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
        chosen = [w for w in fios() if w.name in workloads]
        order = [
            round_label(s, r)
            for r in range(rounds)
            for s in (EFFICIENCY_SCHEDULERS if r % 2 == 0 else EFFICIENCY_SCHEDULERS[::-1])
        ]
        review = {**tunables.get("fios", {}), "timeslice_us": REVIEW_TIMESLICE_US}
        flash = {label: review for label in order if label.startswith("fios+")}
        null_costs = {
            k: v for k, v in tunables.get(NULL_CALIBRATED, {}).items() if k in calibrate.POINTS
        }
        null_fios = {k: v for k, v in review.items() if k not in calibrate.POINTS}
        null = {label: {**null_fios, **null_costs, **(settings or {})} for label in flash}
        flash = {label: {**review, **(settings or {})} for label in flash}
        files: dict[str, str] = {}
        script = FLASHSIM.format(params=f"{FLASH_STRIPED} submit_queues={cpus}")
        script += "insmod /lib/modules/configfs.ko\n" + SMP_DEVICES["nullb0"].format(cpus=cpus)
        for dev, these in (("flashsim0", flash), ("nullb0", null)):
            if dev not in devices:
                continue
            more, more_files = fairness_files(
                chosen, tuple(order), seconds, these, dev=dev, guest_cpu=True
            )
            if dev != "flashsim0" and "flashsim0" in devices:  # fios is loaded already
                more = more.replace("insmod /lib/modules/fios.ko\n", "")
            for name, value in (settings or {}).items():  # one that does not take is said so
                path = f"/sys/block/{dev}/queue/iosched/{name}"
                more = more.replace(
                    f"echo {value} > {path}\n",
                    f'echo {value} > {path}\ntest "$(cat {path})" = {value}'
                    f' || echo {qemu.TUNABLE_NOT_SET} {name}={value} "$(cat {path})"\n',
                )
            script += more + f"echo none > /sys/block/{dev}/queue/scheduler\n"
            files.update(more_files)
        script += "rmmod fios\ntest -e /sys/module/fios && echo BLKPILOT-UNLOAD-FAILED\n"
        return script, files

    return make


def fios_counters_per_io(counters: dict[str, str], ios: float) -> dict[str, float]:
    """fios' counters over one run (its stats, from a fresh instance), per request completed:
    the queue runs its completions asked for (kicks), the writes it held, the requests it
    issued on lent time and its anticipations."""
    if ios <= 0:
        return {}
    wanted = ("kicks", "writes_held", "lent", "anticipations")
    return {k: round(int(counters[k]) / ios, 3) for k in wanted if k in counters}


def _together(
    parsed: dict[str, fio_jobs.FioResult], workload: str, scheduler: str, index: int
) -> tuple[str, float]:
    """The label of a round's run of all the workload's tasks together, and its requests."""
    label = f"{workload}/{round_label(scheduler, index)}/together"
    return label, parsed[label].metrics.get("ios", 0.0)


def summarize_efficiency(
    parsed: dict[str, fio_jobs.FioResult], stats: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """Per case (workload and device): each round's concurrent efficiency and worst over
    proportional slowdown under both schedulers, fios' epochs; fios' efficiency over
    mq-deadline's round by round (the paired ratios), their geometric mean and range, and in
    how many rounds fios kept the device at least as busy."""
    review = summarize_review(parsed, stats)["fairness"]
    cases: dict[str, Any] = {}
    for workload, by_label in review.items():
        rounds: dict[int, dict[str, Any]] = {}
        for label, case in by_label.items():
            scheduler, _, index = label.partition("+r")
            rounds.setdefault(int(index), {})[scheduler] = case
        paired = sorted(r for r, both in rounds.items() if len(both) == len(EFFICIENCY_SCHEDULERS))
        ratios = [
            rounds[r]["fios"]["concurrent_efficiency"]
            / rounds[r]["mq-deadline"]["concurrent_efficiency"]
            for r in paired
        ]
        cpu = {
            s: [
                guest_cpu_per_io(stats.get(f"{label}/cpu", {}), ios)
                for label, ios in (_together(parsed, workload, s, r) for r in paired)
            ]
            for s in EFFICIENCY_SCHEDULERS
        }
        cases[workload.removeprefix("fios-")] = {
            "rounds": len(paired),
            # the guest's CPU per round, and fios' busy µs a request over mq-deadline's
            "guest_cpu": cpu,
            # fios' own counters over the run together (a fresh instance: they are its),
            # per request: queue runs a completion asked for, writes held, requests lent
            "fios_per_io": [
                fios_counters_per_io(stats.get(label, {}), ios)
                for label, ios in (_together(parsed, workload, "fios", r) for r in paired)
            ],
            "busy_us_per_io_ratios": [
                round(f["busy_us_per_io"] / m["busy_us_per_io"], 3)
                for f, m in zip(cpu["fios"], cpu["mq-deadline"], strict=True)
                if f.get("busy_us_per_io") and m.get("busy_us_per_io")
            ],
            "efficiency": {
                s: [rounds[r][s]["concurrent_efficiency"] for r in paired]
                for s in EFFICIENCY_SCHEDULERS
            },
            "worst_over_proportional": {
                s: [rounds[r][s]["worst_over_proportional"] for r in paired]
                for s in EFFICIENCY_SCHEDULERS
            },
            # each task's slowdown (alone over together), round by round: whose share moved
            "slowdowns": {
                s: [rounds[r][s].get("slowdowns", {}) for r in paired]
                for s in EFFICIENCY_SCHEDULERS
            },
            "fios_epochs": [rounds[r]["fios"].get("epochs") for r in paired],
            "ratios": [round(x, 3) for x in ratios],
            "ratio_geomean": round(statistics.geometric_mean(ratios), 3) if ratios else None,
            "fios_at_least_as_busy": sum(x >= 1.0 for x in ratios),
        }
    return {"cases": cases}


PAUSE_WORKLOAD = "fios-1r-pause50ms-4w"
PAUSE_SCHEDULERS = ("none", "fios")


def _pause(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
    """Deceptive idleness' hard case (issue 36): a reader pausing 50 ms after every 200 ms of
    I/O against four writers, under none and fios (calibrated, the review's 20 ms slices)."""
    chosen = [w for w in fios() if w.name == PAUSE_WORKLOAD]
    review = {**tunables.get("fios", {}), "timeslice_us": REVIEW_TIMESLICE_US}
    script, files = fairness_files(chosen, PAUSE_SCHEDULERS, seconds, {**tunables, "fios": review})
    script += (
        "echo none > /sys/block/flashsim0/queue/scheduler\nrmmod fios\nrmmod flashsim\n"
        "test -e /sys/module/fios && echo BLKPILOT-UNLOAD-FAILED\n"
    )
    return FLASHSIM.format(params=FLASH_STRIPED) + script, files


# RocksDB against writers (issue 36, a real application): db_bench's random reads of a
# database on ext4 on flashsim, against the review's writers (psync, 4 KiB, four of them)
# writing a file of their own on the same filesystem, on two vCPUs with a queue each
ROCKSDB_WORKLOAD = "rocksdb-4w"
ROCKSDB_SCHEDULERS = ("none", "mq-deadline", "bfq", "fios")
ROCKSDB_DEVICE_MB = 256
ROCKSDB_FLASH = f"{FLASH_STRIPED} size_mb={ROCKSDB_DEVICE_MB} submit_queues=2"
ROCKSDB_MODULES = ["bfq", "crc16", "mbcache", "jbd2", "crc32c_generic", "ext4"]
_MOUNT = "/mnt"
_WRITES = "/tmp/w.json"  # noqa: S108 - the guest's own tmpfs
# the filesystem on flashsim0, as the agent's directory target for both
_ROCKSDB_FS = BenchTarget(
    Path(_MOUNT), "flashsim0", True, False, size_bytes=ROCKSDB_DEVICE_MB << 20
)


def rocksdb_parts() -> tuple[DbBenchSpec, dbbench.DbBenchDatabase, WorkloadSpec]:
    """The reader (the library's db_bench readrandom, its database sized for the device as the
    agent sizes one) and the writers (the review's: fios-1r-think1ms-4w's four writers), on the
    filesystem at /mnt."""
    workloads = library()
    spec = workloads["rocksdb-readrandom"].db_bench
    assert spec is not None
    db = dbbench.database(spec, _ROCKSDB_FS)
    their = workloads["fios-1r-think1ms-4w"]
    (writer,) = [j for j in their.jobs if j.name == "writer"]
    writers = WorkloadSpec(name=ROCKSDB_WORKLOAD, engine=their.engine, jobs=[writer])
    return spec, db, writers


def _rocksdb(rounds: int, seconds: float, tunables: Tunables) -> tuple[str, dict[str, str]]:
    """Under each scheduler: db_bench's reader alone, the writers alone, then both — the
    writers started a second ahead (their first second not counted) and running a second past
    the reader's `seconds`. fios calibrated, with the review's 20 ms slices."""
    spec, db, writers = rocksdb_parts()
    timed = writers.model_copy(update={"duration_s": seconds + 1, "warmup_s": 1.0})
    warm = writers.model_copy(update={"duration_s": 1.0})
    files = {
        "jobs/writers.fio": fio_jobs.job_file(timed, _ROCKSDB_FS),
        "jobs/warm.fio": fio_jobs.job_file(warm, _ROCKSDB_FS),
    }
    fill = " ".join(dbbench.fill_arguments(spec, db))
    read = " ".join(dbbench.read_arguments(spec, db, seconds))
    fios_tunables = {**tunables.get("fios", {}), "timeslice_us": REVIEW_TIMESLICE_US}
    queue = "/sys/block/flashsim0/queue"
    fio = "fio --eta=never --output-format=json+"

    def app(label: str) -> str:
        return f"echo BLKPILOT-APP-BEGIN {label}\ncat /tmp/db.txt\necho BLKPILOT-APP-END\n"

    def result(label: str, out: str) -> str:
        return f"echo BLKPILOT-RESULT-BEGIN {label}\ncat {out}\necho BLKPILOT-RESULT-END\n"

    script = FLASHSIM.format(params=ROCKSDB_FLASH)
    script += "".join(f"insmod /lib/modules/{m}.ko\n" for m in ROCKSDB_MODULES)
    script += "insmod /lib/modules/fios.ko\n"
    script += (
        "mke2fs -q -b 4096 /dev/flashsim0 >/dev/null\n"
        f"mkdir -p {_MOUNT}\nmount -t ext4 /dev/flashsim0 {_MOUNT} || echo BLKPILOT-MOUNT-FAILED\n"
        f"db_bench {fill} > /tmp/db.txt 2>&1\n"
        + app(f"{ROCKSDB_WORKLOAD}/fill")
        # unrecorded: the writers' file laid out, and TCG's first translation of both programs
        + f"{fio} --output=/tmp/warm.json /jobs/warm.fio\n"
        + f"db_bench {' '.join(dbbench.read_arguments(spec, db, 1))} > /dev/null 2>&1\n"
    )
    for scheduler in ROCKSDB_SCHEDULERS:
        prefix = f"{ROCKSDB_WORKLOAD}/{scheduler}"
        script += f"echo none > {queue}/scheduler\necho {scheduler} > {queue}/scheduler\n"
        if scheduler == "fios":
            script += "".join(
                f"echo {value} > {queue}/iosched/{name}\n" for name, value in fios_tunables.items()
            )
        script += f"db_bench {read} > /tmp/db.txt 2>&1\n" + app(f"{prefix}/alone-reader")
        script += f"{fio} --output={_WRITES} /jobs/writers.fio\n"
        script += result(f"{prefix}/alone-writers", _WRITES)
        script += (
            f"{fio} --output={_WRITES} /jobs/writers.fio &\nsleep 1\n"
            f"db_bench {read} > /tmp/db.txt 2>&1\nwait\n"
        )
        script += result(f"{prefix}/together-writers", _WRITES)
        script += app(f"{prefix}/together-reader")
        if scheduler == "fios":
            script += (
                f"echo BLKPILOT-STATS-BEGIN {prefix}/together\ncat {queue}/iosched/stats\n"
                "echo BLKPILOT-STATS-END\n"
            )
    script += (
        f"umount {_MOUNT}\necho none > {queue}/scheduler\nrmmod fios\nrmmod flashsim\n"
        "test -e /sys/module/fios && echo BLKPILOT-UNLOAD-FAILED\n"
    )
    return script, files


def summarize_rocksdb(
    parsed: dict[str, fio_jobs.FioResult], apps: dict[str, str]
) -> dict[str, Any]:
    """Per scheduler, db_bench's own figures — reads a second and p99 (µs), alone and against
    the writers — and the fairness between the reader and the writers as FIOS measures it: each
    side's slowdown (alone over together) over its proportional one (five tasks of one weight:
    the reader 5, the four writers together 5/4), and the concurrent efficiency (the reader's
    reads a second over alone, plus the writers' writes a second over theirs alone)."""
    spec, _, writers = rocksdb_parts()
    tasks = 1 + sum(job.tasks for job in writers.jobs)
    found: dict[str, Any] = {}
    for scheduler in ROCKSDB_SCHEDULERS:
        prefix = f"{ROCKSDB_WORKLOAD}/{scheduler}"
        if f"{prefix}/together-reader" not in apps:
            continue
        alone = dbbench.parse(apps[f"{prefix}/alone-reader"], spec.value_size)
        together = dbbench.parse(apps[f"{prefix}/together-reader"], spec.value_size)
        writes_alone = sum(t.iops for t in parsed[f"{prefix}/alone-writers"].tasks)
        writes_together = sum(t.iops for t in parsed[f"{prefix}/together-writers"].tasks)
        reader = alone["iops"] / together["iops"]
        writer = writes_alone / writes_together
        found[scheduler] = {
            "reads_per_s": {"alone": alone["iops"], "together": together["iops"]},
            "read_p99_us": {
                "alone": alone.get("lat_p99_us"),
                "together": together.get("lat_p99_us"),
            },
            "writes_per_s": {
                "alone": round(writes_alone, 1),
                "together": round(writes_together, 1),
            },
            "reader_over_proportional": round(reader / tasks, 2),
            "writers_over_proportional": round(writer / (tasks / (tasks - 1)), 2),
            "worst_over_proportional": round(
                max(reader / tasks, writer / (tasks / (tasks - 1))), 2
            ),
            "concurrent_efficiency": round(1 / reader + 1 / writer, 3),
        }
    return {"rocksdb": found}


def _heavy_light(heavy_iops: float, light_iops: float) -> dict[str, Any]:
    """Two weighed writers' throughputs and their ratio (device time, as a write takes every
    unit)."""
    return {
        "heavy_iops": round(heavy_iops, 1),
        "light_iops": round(light_iops, 1),
        "ratio": round(heavy_iops / light_iops, 2) if light_iops else None,
    }


def summarize_review(
    parsed: dict[str, fio_jobs.FioResult], stats: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """The fairness cases (with fios' epochs per run), the weights' device-time ratio, and
    what the writer keeps under reader churn."""
    fairness_runs = {k: v for k, v in parsed.items() if k.split("/")[0].startswith("fios-")}
    summary: dict[str, Any] = {"fairness": summarize_fairness(fairness_runs)}
    for label, counters in stats.items():
        if label.count("/") != 2:
            continue  # observe/fios, below
        workload, scheduler, kind = label.split("/")
        if kind == "together" and workload in summary["fairness"] and "epochs" in counters:
            case = summary["fairness"][workload][scheduler]
            case["epochs"] = int(counters["epochs"])
            case["anticipation_hits"] = (
                f"{counters['anticipation_hits']}/{counters['anticipations']}"
            )
            if "lent" in counters:
                case["lent"] = int(counters["lent"])  # requests issued on lent time
    weights = {}
    for label, result in parsed.items():
        if label.startswith("weights/"):
            iops = {t.job: t.iops for t in result.tasks}
            weights[label.split("/")[1]] = _heavy_light(iops["heavy"], iops["light"])
    summary["weights"] = weights
    cgroup_weights = {}
    for scheduler in WEIGHT_SCHEDULERS:
        heavy = parsed.get(f"cgroup-weights/{scheduler}/heavy")
        light = parsed.get(f"cgroup-weights/{scheduler}/light")
        if heavy is None or light is None:
            continue
        cgroup_weights[scheduler] = {
            **_heavy_light(heavy.tasks[0].iops, light.tasks[0].iops),
            **{
                k: v
                for k, v in stats.get(f"cgroup-weights/{scheduler}", {}).items()
                if k.endswith(("_weight", "_exit")) or k.startswith(("tunable_", "drift_"))
            },
        }
    summary["cgroup_weights"] = cgroup_weights
    churn: dict[str, dict[str, float | int]] = {}
    for scheduler in CHURN_SCHEDULERS:
        alone = parsed.get(f"churn/{scheduler}/alone")
        together = parsed.get(f"churn/{scheduler}/together")
        if alone is None or together is None:
            continue
        kept = together.tasks[0].iops / alone.tasks[0].iops if alone.tasks[0].iops else 0.0
        counters = stats.get(f"churn/{scheduler}/together", {})
        churn[scheduler] = {
            "writer_iops_alone": round(alone.tasks[0].iops, 1),
            "writer_iops_with_churn": round(together.tasks[0].iops, 1),
            "writer_kept": round(kept, 3),
            "readers": int(counters.get("readers", 0)),
            **({"epochs": int(counters["epochs"])} if "epochs" in counters else {}),
            **{k: int(counters[k]) for k in ("io_cqs_left", "pinned_left") if k in counters},
        }
    summary["churn"] = churn
    observed = stats.get("observe/fios")
    if observed is not None:
        summary["observe"] = {
            "state": {k[len("state_") :]: v for k, v in observed.items() if k.startswith("state_")},
            "tasks": [v for k, v in sorted(observed.items()) if k.startswith("task")],
            "stats": {
                k: int(observed[k])
                for k in ("epochs", "anticipations", "anticipation_hits")
                if k in observed
            },
            "trace": {
                k[len("trace_") :]: int(v) for k, v in observed.items() if k.startswith("trace_")
            },
            "samples": [v for k, v in sorted(observed.items()) if k.startswith("sample")],
        }
    return summary


# rounds of the calibration in its boot, each point once a round: a round whose costs do not
# grow with size (a starved guest's spell) is set aside, and the least of each point over
# the usable rounds is taken, as the agent calibrates (agent.calibrate.least_of); with no
# usable round the calibration says it cannot
CALIBRATION_ROUNDS = 2


def _calibrated(
    parsed: dict[str, Any], stat: dict[str, tuple[str, str]], prefix: str
) -> dict[str, int] | None:
    """One device's costs from its calibration rounds (labelled PREFIXrN/POINT): each round's
    by agent.calibrate.costs_from, the least of each point over the usable ones
    (agent.calibrate.least_of, which refuses when no round was usable); None where the
    device was not calibrated in this boot."""
    measured, failures = [], []
    for round_ in range(CALIBRATION_ROUNDS):
        head = f"{prefix}r{round_}/"
        found = {k[len(head) :]: v for k, v in parsed.items() if k.startswith(head)}
        if not found:
            continue
        readings = {k[len(head) :]: v for k, v in stat.items() if k.startswith(head)}
        try:
            measured.append(calibrate.costs_from(found, readings))
        except BenchmarkFailed as failed:
            failures.append(str(failed))
    if not measured and not failures:
        return None
    costs, _ = calibrate.least_of(measured, failures)
    return costs


def calibration_files(
    seconds: float,
    params: str = FLASH_LIKE,
    null_queues: int = 0,
    rounds: int = CALIBRATION_ROUNDS,
) -> tuple[str, dict[str, str]]:
    """The agent's calibration runs (agent.calibrate) on flashsim under fios, `rounds` times
    (labelled rN/POINT); with `null_queues`, on null_blk with that many hardware queues too
    (nullb0/rN/POINT)."""
    script = FLASHSIM.format(params=params) + "insmod /lib/modules/fios.ko\n"
    devices = [("flashsim0", "")]
    if null_queues:
        script += "insmod /lib/modules/configfs.ko\n"
        script += SMP_DEVICES["nullb0"].format(cpus=null_queues)
        devices.append(("nullb0", "nullb0/"))
    files = {}
    for dev, prefix in devices:
        target = BenchTarget(Path(f"/dev/{dev}"), dev, False, False)
        script += f"echo fios > /sys/block/{dev}/queue/scheduler\n"
        for tunable, spec in calibrate.workloads(seconds, warmup_s=0.3).items():
            files[f"jobs/{prefix.rstrip('/')}{tunable}.fio"] = fio_jobs.job_file(spec, target)
        for round_ in range(rounds):
            for tunable in calibrate.POINTS:  # interleaved: a slow spell touches every point
                label = f"{prefix}r{round_}/{tunable}"
                script += (
                    f"before=$(cat /sys/block/{dev}/stat)\n"
                    "fio --eta=never --output-format=json+ --output=/tmp/out.json"
                    f" /jobs/{prefix.rstrip('/')}{tunable}.fio\n"
                    f"echo BLKPILOT-RESULT-BEGIN {label}\ncat /tmp/out.json\n"
                    "echo BLKPILOT-RESULT-END\n"
                    f'echo BLKPILOT-STATS-BEGIN {label}\necho "before $before"\n'
                    f'echo "after $(cat /sys/block/{dev}/stat)"\necho BLKPILOT-STATS-END\n'
                )
        script += f"echo none > /sys/block/{dev}/queue/scheduler\n"
    script += "rmmod fios\nrmmod flashsim\n"
    return script, files


SCENARIOS = {
    # FIOS for a kernel reviewer: harder cases, weights and churn (bench/lab_fios_review.py);
    # the short one runs in the suite
    "flash-review": Scenario(
        ["bfq"],
        ["flashsim", "fios"],
        _review(REVIEW_WORKLOADS, REVIEW_SCHEDULERS),
        lambda parsed: summarize_review(parsed, {}),
        calibrate=True,
        flash_params=FLASH_STRIPED,
        summarize_stats=summarize_review,
    ),
    "flash-review-short": Scenario(
        ["bfq"],
        ["flashsim", "fios"],
        _review(
            ("fios-4r4w-think", "fios-1r-think1ms-4w", "fios-1r7w", PAUSE_WORKLOAD),
            ("mq-deadline", "fios"),
        ),
        lambda parsed: summarize_review(parsed, {}),
        calibrate=True,
        flash_params=FLASH_STRIPED,
        summarize_stats=summarize_review,
    ),
    # RocksDB's reads against writers on two vCPUs (bench/lab_fios_rocksdb.py)
    "flash-rocksdb-smp2": Scenario(
        ROCKSDB_MODULES,
        ["flashsim", "fios"],
        _rocksdb,
        lambda parsed: {},
        calibrate=True,
        cpus=2,
        flash_params=ROCKSDB_FLASH,
        binaries=("fio", "db_bench"),
        summarize_apps=summarize_rocksdb,
    ),
    # deceptive idleness: a reader that pauses (bench/lab_fios_pause.py boots it again and again)
    "flash-pause": Scenario(
        [],
        ["flashsim", "fios"],
        _pause,
        lambda parsed: summarize_review(parsed, {}),
        calibrate=True,
        flash_params=FLASH_STRIPED,
        summarize_stats=summarize_review,
    ),
    **{
        f"smp{cpus}": Scenario(
            ["configfs", "null_blk", "kyber-iosched", "bfq"],
            ["flashsim", "fios"],
            _smp(cpus),
            lambda parsed: summarize_smp(parsed, {}),
            summarize_stats=summarize_smp,
            cpus=cpus,
        )
        for cpus in (2, 4)
    },
    # the depth limit on one vCPU (the SMP scenarios run it too)
    "flash-depth": Scenario(
        [],
        ["flashsim", "fios"],
        _depth,
        lambda parsed: summarize_smp(parsed, {}),
        summarize_stats=summarize_smp,
    ),
    # the scheduler hooks' own cost, timed in the guest (kernel/lab/hooks.py)
    "null-hooks": Scenario(
        ["configfs", "null_blk"],
        ["fios"],
        lambda rounds, seconds, tunables: (hooks.script(rounds, seconds), {}),
        lambda parsed: hooks.summarize(parsed, {}),
        summarize_stats=hooks.summarize,
        # the guest reduces a run's trace after it: ~50 s after each 10 s run in
        # bench/lab_hooks (~10,000 trace lines per second under TCG); twice that allowed
        after_run=10.0,
    ),
    "null-overhead": Scenario(
        ["configfs", "null_blk", "kyber-iosched", "bfq"],
        ["fios"],
        _overhead,
        lambda parsed: summarize_overhead({k: v.metrics for k, v in parsed.items()}),
    ),
    "flash-fairness-rw": Scenario(
        ["kyber-iosched", "bfq"],
        ["flashsim", "fios"],
        _fairness(["fios-1r1w", "fios-4r4w"], (*SCHEDULERS, "fios+noantic")),
        summarize_fairness,
        calibrate=True,
    ),
    "flash-fairness-1r1w": Scenario(
        ["kyber-iosched", "bfq"],
        ["flashsim", "fios"],
        _fairness(["fios-1r1w"]),
        summarize_fairness,
        calibrate=True,
    ),
    "flash-polling": Scenario(
        [], ["flashsim"], _polling, summarize_polling, summarize_stats=summarize_polling
    ),
    "flash-fairness": Scenario(
        ["kyber-iosched", "bfq"],
        ["flashsim", "fios"],
        _fairness(["fios-1r1w", "fios-4r4w", "fios-4r4w-think", "fios-4k-vs-128k"]),
        summarize_fairness,
        calibrate=True,
    ),
}
for _cpus in (2, 4):
    SCENARIOS[f"efficiency-smp{_cpus}"] = Scenario(
        ["configfs", "null_blk"],
        ["flashsim", "fios"],
        efficiency_script(_cpus),
        lambda parsed: summarize_efficiency(parsed, {}),
        calibrate=True,
        flash_params=f"{FLASH_STRIPED} submit_queues={_cpus}",
        calibrate_null=_cpus,
        summarize_stats=summarize_efficiency,
        cpus=_cpus,
    )
# the review on two and four vCPUs (issue 36): flashsim and null_blk with a hardware queue per
# vCPU, so that requests arrive on every queue and fios' one lock and one set of slices serve
# them all; fio's processes also wait less for a CPU between their requests, as on any real
# node (on one vCPU four of them and the guest's interrupts share it under TCG)
for _cpus in (2, 4):
    _flash = f"{FLASH_STRIPED} submit_queues={_cpus}"
    SCENARIOS[f"flash-review-smp{_cpus}"] = replace(
        SCENARIOS["flash-review"],
        modules=["bfq", "configfs", "null_blk"],
        script=_review(REVIEW_WORKLOADS, REVIEW_SCHEDULERS, flash=_flash, null_queues=_cpus),
        cpus=_cpus,
        flash_params=_flash,
        calibrate_null=_cpus,
    )


def _boot(
    name: str,
    trio: packages.KernelTrio,
    root: Path,
    modules: list[Path],
    script: str,
    files: dict[str, str],
    seconds: float,
    cache: Path,
    cpus: int = 1,
    after_run: float = 0.0,
    binaries: tuple[str, ...] = ("fio",),
) -> tuple[qemu.Boot, dict[str, fio_jobs.FioResult]]:
    initrd = initramfs.build(
        cache / trio.version / f"{name}.initrd.gz",
        modules=modules,
        scenario=script,
        files=files,
        binaries=binaries,
    )
    expected_runs = script.count("BLKPILOT-RESULT-BEGIN") + script.count("BLKPILOT-APP-BEGIN")
    booted = qemu.boot(
        packages.vmlinuz(root, trio),
        initrd,
        cpus=cpus,
        # TCG runs every vCPU as a thread on the host's two cores: SMP guests are slower
        timeout=120 + expected_runs * (seconds * (1 + after_run) + 4) * cpus,
    )
    parsed = {}
    for label, body in booted.results.items():
        parsed[label] = fio_jobs.parse(json.loads(body[body.index("{") :]))
    return booted, parsed


def run(
    name: str,
    *,
    rounds: int = 2,
    seconds: float = 2.0,
    cache: Path = packages.DEFAULT_CACHE,
    scenario: Scenario | None = None,
) -> LabResult:
    """Boot the lab and run the scenario `name` (or `scenario`, a variant of one, under that
    name), after a calibration boot where the scenario asks for one."""
    scenario = scenario or SCENARIOS[name]
    trio = packages.select_trio()
    root = packages.fetch(trio, cache, with_build=bool(scenario.ours))
    modules = _modules(root, trio, scenario.modules)
    modules += [
        build.build_module(m, root, trio, cache / trio.version / "build") for m in scenario.ours
    ]
    started = datetime.now(UTC)
    tunables: Tunables = {}
    problems: list[str] = []
    if scenario.calibrate:
        script, files = calibration_files(
            min(seconds, 1.0), scenario.flash_params, scenario.calibrate_null
        )
        # on the vCPUs the scenario runs on, as the agent calibrates a node as it is
        booted, parsed = _boot(
            f"{name}-calibrate",
            trio,
            root,
            modules,
            script,
            files,
            seconds,
            cache,
            cpus=scenario.cpus,
        )
        stat = {k: (v["before"], v["after"]) for k, v in booted.stats.items()}
        for key, prefix in (("fios", ""), (NULL_CALIBRATED, "nullb0/")):
            costs = _calibrated(parsed, stat, prefix)
            if costs is not None:
                tunables[key] = {"alpha_permille": calibrate.DEFAULT_ALPHA_PERMILLE, **costs}
        problems += booted.kernel_problems()
    script, files = scenario.script(rounds, seconds, tunables)
    booted, parsed = _boot(
        name,
        trio,
        root,
        modules,
        script,
        files,
        seconds,
        cache,
        cpus=scenario.cpus,
        after_run=scenario.after_run,
        binaries=scenario.binaries,
    )
    result = LabResult(
        name,
        trio.abi,
        booted.seconds,
        {k: v.metrics for k, v in parsed.items()},
        parsed,
        problems + booted.kernel_problems(),
        stats=booted.stats,
        tunables=tunables,
        apps=booted.apps,
        started_at=started,
        finished_at=datetime.now(UTC),
    )
    if scenario.summarize_apps is not None:
        result.summary = scenario.summarize_apps(parsed, booted.apps)
    elif scenario.summarize_stats is not None:
        result.summary = scenario.summarize_stats(parsed, booted.stats)
    else:
        result.summary = scenario.summarize(parsed)
    return result
