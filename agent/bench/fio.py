"""fio: a job file from a workload spec, run with JSON+ output, parsed.

Latency is total latency, submission to completion (fio's lat, with lat_percentiles=1): with
io_uring many I/Os complete inline during submission, so fio's clat alone reports sub-µs
medians that no application sees. JSON+ carries each task's full latency histogram, so
percentiles over all tasks come from the merged histogram, not from averaging percentiles."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.bench.target import SCRATCH_PREFIX, BenchTarget
from agent.contract.workloads import Arrival, IOEngine, IOPattern, JobSpec, WorkloadSpec
from agent.effects import Effects
from agent.errors import BenchmarkFailed

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
ENGINES = {
    IOEngine.IO_URING: ("io_uring", {}),
    IOEngine.IO_URING_POLL: ("io_uring", {"hipri": "1"}),
    IOEngine.PSYNC: ("psync", {}),
    IOEngine.LIBAIO: ("libaio", {}),
}


def _size(value: int) -> str:
    return f"{value // 1024}k" if value % 1024 == 0 else str(value)


def _milliseconds(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def job_section(job: JobSpec) -> dict[str, str]:
    options = {"rw": job.pattern.value, "iodepth": str(job.queue_depth), "numjobs": str(job.tasks)}
    if job.pattern in (IOPattern.RANDRW, IOPattern.RW):
        options["rwmixread"] = str(round(job.read_share * 100))
    if len(job.block_sizes) == 1:
        options["bs"] = _size(next(iter(job.block_sizes)))
    else:
        options["bssplit"] = ":".join(f"{_size(s)}/{p}" for s, p in sorted(job.block_sizes.items()))
    if job.arrival is Arrival.POISSON:
        options["rate_iops"] = str(max(1, round(1_000_000 / job.thinktime_us)))
        options["rate_process"] = "poisson"
    elif job.thinktime_us:
        options["thinktime"] = f"{job.thinktime_us}us"
        if job.thinktime_every_us:
            options["thinktime_iotime"] = f"{job.thinktime_every_us}us"
    return options


def job_file(workload: WorkloadSpec, target: BenchTarget, *, file_bytes: int = 256 << 20) -> str:
    engine, engine_options = ENGINES[workload.engine]
    common = {
        "direct": "1",
        "ioengine": engine,
        **engine_options,
        "time_based": "1",
        "runtime": _milliseconds(workload.duration_s),
        "group_reporting": "0",
        "randrepeat": "0",
        "norandommap": "1",
        "lat_percentiles": "1",
        "clat_percentiles": "0",
        "percentile_list": ":".join(f"{p:g}" for p in PERCENTILES),
    }
    if workload.warmup_s:
        common["ramp_time"] = _milliseconds(workload.warmup_s)
    if target.is_directory:
        common["filename"] = str(target.path / f"{SCRATCH_PREFIX}-{workload.name}.dat")
        common["size"] = str(min(file_bytes, max(target.size_bytes // 4, 1 << 20)))
    else:
        common["filename"] = str(target.path)
    lines = ["[global]", *(f"{k}={v}" for k, v in common.items())]
    for job in workload.jobs:
        lines += ["", f"[{job.name}]", *(f"{k}={v}" for k, v in job_section(job).items())]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TaskResult:
    job: str
    index: int
    ios: int
    io_bytes: int
    iops: float
    mean_latency_us: float
    p50_us: float
    p99_us: float
    max_us: float = 0.0


@dataclass(frozen=True)
class FioResult:
    tasks: list[TaskResult]
    metrics: dict[str, float]
    histogram: dict[int, int] = field(default_factory=dict)  # ns -> completions


def _percentile(histogram: dict[int, int], percent: float) -> float:
    total = sum(histogram.values())
    rank, seen = math.ceil(total * percent / 100), 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= rank:
            return float(value)
    return 0.0


def parse(document: dict[str, Any]) -> FioResult:
    """Parse fio's JSON+ output (one entry per task with group_reporting=0)."""
    jobs = document.get("jobs")
    if not jobs:
        raise BenchmarkFailed("fio output has no jobs")
    tasks, merged = [], {}  # type: ignore[var-annotated]
    counters = {
        "ios": 0,
        "bytes": 0,
        "read_ios": 0,
        "write_ios": 0,
        "usr": 0.0,
        "sys": 0.0,
        "ctx": 0,
    }
    seconds = max(job["job_runtime"] for job in jobs) / 1000
    index: dict[str, int] = {}
    for job in jobs:
        if job.get("error"):
            raise BenchmarkFailed(f"fio job {job['jobname']} failed with error {job['error']}")
        histogram: dict[int, int] = {}
        ios = io_bytes = 0
        weighted_latency = worst = 0.0
        for direction in ("read", "write"):
            side = job[direction]
            n = int(side["total_ios"])
            ios += n
            io_bytes += int(side["io_bytes"])
            counters[f"{direction}_ios"] += n
            weighted_latency += side["lat_ns"]["mean"] * n
            if n:
                worst = max(worst, float(side["lat_ns"].get("max", 0)))
            for value, count in side["lat_ns"].get("bins", {}).items():
                histogram[int(value)] = histogram.get(int(value), 0) + int(count)
        for value, count in histogram.items():
            merged[value] = merged.get(value, 0) + count
        position = index[job["jobname"]] = index.get(job["jobname"], -1) + 1
        runtime = job["job_runtime"] / 1000 or seconds
        tasks.append(
            TaskResult(
                job["jobname"],
                position,
                ios,
                io_bytes,
                ios / runtime if runtime else 0.0,
                weighted_latency / ios / 1000 if ios else 0.0,
                # fio's bins stand for their bucket's midpoint, which can lie above the exact
                # maximum when that falls in the bucket's lower half: no percentile exceeds it
                min(_percentile(histogram, 50), worst or math.inf) / 1000,
                min(_percentile(histogram, 99), worst or math.inf) / 1000,
                worst / 1000,
            )
        )
        counters["ios"] += ios
        counters["bytes"] += io_bytes
        counters["usr"] += float(job["usr_cpu"])
        counters["sys"] += float(job["sys_cpu"])
        counters["ctx"] += int(job["ctx"])
    if not merged:
        raise BenchmarkFailed(
            "fio output has no latency histogram (run with --output-format=json+)"
        )
    metrics = {
        "iops": counters["ios"] / seconds,
        "read_iops": counters["read_ios"] / seconds,
        "write_iops": counters["write_ios"] / seconds,
        "bw_bytes_per_s": counters["bytes"] / seconds,
        "lat_mean_us": sum(v * c for v, c in merged.items()) / sum(merged.values()) / 1000,
        **{f"lat_p{p:g}_us".replace(".", ""): _percentile(merged, p) / 1000 for p in PERCENTILES},
        "cpu_usr_pct": counters["usr"],
        "cpu_sys_pct": counters["sys"],
        "context_switches_per_io": counters["ctx"] / counters["ios"] if counters["ios"] else 0.0,
        "ios": float(counters["ios"]),
        "io_bytes": float(counters["bytes"]),
        "seconds": seconds,
    }
    return FioResult(tasks, metrics, merged)


def run(
    workload: WorkloadSpec, target: BenchTarget, *, effects: Effects | None = None, workdir: Path
) -> FioResult:
    fio = shutil.which("fio")
    if fio is None:
        raise BenchmarkFailed("fio is not installed (Debian package fio)")
    workdir.mkdir(parents=True, exist_ok=True)
    jobs = workdir / f"{workload.name}.fio"
    jobs.write_text(job_file(workload, target))
    argv = [fio, "--output-format=json+", str(jobs)]
    if not workload.writes:
        argv.insert(1, "--readonly")  # fio itself refuses any write
    timeout = workload.duration_s + workload.warmup_s + 60
    result = (effects or Effects()).run(*argv, timeout=timeout)
    if result.returncode != 0:
        raise BenchmarkFailed(f"fio failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    try:
        document = json.loads(result.stdout[result.stdout.index("{") :])
    except (ValueError, json.JSONDecodeError) as error:
        raise BenchmarkFailed(f"fio output is not JSON: {result.stdout[:200]!r}") from error
    return parse(document)
