"""FIOS cost calibration (FAST '12, section 4.3).

FIOS charges each request a cost against its task's timeslice. With calibration it uses a
linear model through four points — standalone read and write at 4 KiB and 128 KiB — so that a
read stuck behind a write on the device is not billed for the write's time. The agent measures
the four points with fio (one task, queue depth 1, nothing else running on the device) when a
policy chooses fios, and writes them, with the policy's alpha, to fios' tunables.

A point's cost is the request's time inside the block layer — from the device's own
/sys/block/NAME/stat (ticks over completions, the kernel's per-request accounting) — which is
what fios measures from issue to completion. fio's latency adds the system call and the wake-up
of the task on top; it is used only where the device statistics are not usable.

Measuring write costs writes to the device, so it happens only on scratch devices (no data;
see agent.bench.target). On a device that holds data nothing is measured: fios then charges
elapsed time divided by the parallelism at issue (the paper's equation 1), and the agent says
so. Costs are kept per device in the state directory: a device is calibrated once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from agent.bench import fio
from agent.bench.target import BenchTarget
from agent.contract.tunables import SCHEDULER_TUNABLES, DeviceConfig, Scheduler
from agent.contract.workloads import IOEngine, IOPattern, JobSpec, WorkloadSpec
from agent.effects import Effects
from agent.errors import BenchmarkFailed
from agent.fsutil import read_json, write_json_atomic
from agent.host import HostPaths, read_text

log = logging.getLogger(__name__)

POINTS: dict[str, tuple[IOPattern, int]] = {
    "cost_read_4k_ns": (IOPattern.RANDREAD, 4096),
    "cost_read_128k_ns": (IOPattern.RANDREAD, 131072),
    "cost_write_4k_ns": (IOPattern.RANDWRITE, 4096),
    "cost_write_128k_ns": (IOPattern.RANDWRITE, 131072),
}
DEFAULT_ALPHA_PERMILLE = 500  # the paper's alpha = 0.5
# fios charges a request by the line through a direction's 4 KiB and 128 KiB points, so the
# larger point must not cost less: a 128 KiB write measured below the 4 KiB one extrapolated a
# 1 MiB write to 1 µs. Below it by at most this share is the measurement's noise (on a
# memory-backed device the two differ little): the direction is then charged flat, at the
# 4 KiB point. Further below, the calibration is refused and fios charges elapsed time.
SIZE_NOISE = 0.25


@dataclass(frozen=True)
class Calibration:
    device: str
    costs: dict[str, int]  # tunable -> ns; empty when not measured
    measured_at: str
    note: str

    @property
    def calibrated(self) -> bool:
        return set(self.costs) == set(POINTS)


def workloads(seconds: float = 2.0, warmup_s: float = 0.5) -> dict[str, WorkloadSpec]:
    """One standalone QD1 job per calibration point."""
    specs = {}
    for tunable, (pattern, size) in POINTS.items():
        job = JobSpec(
            name="calibrate",
            pattern=pattern,
            read_share=1.0 if pattern is IOPattern.RANDREAD else 0.0,
            block_sizes={size: 100},
        )
        specs[tunable] = WorkloadSpec(
            name=f"fios-{tunable.removeprefix('cost_').removesuffix('_ns').replace('_', '-')}",
            engine=IOEngine.PSYNC,
            jobs=[job],
            duration_s=seconds,
            warmup_s=warmup_s,
        )
    return specs


# Each point is measured this many times, the rounds interleaved, and its least cost kept: other
# work on the host (a loop device's completions run on its CPUs) only ever adds time, so the
# least of several is the nearest to the standalone cost. One round under load once measured a
# 4 KiB read at 20.6 µs and a 128 KiB one at 14.2 µs; a round that contradicts itself that way
# is set aside, and the calibration is refused only when no round is usable.
ROUNDS = 3

MIN_TICKS_MS = 50  # below this, the ms-resolution tick counter is too coarse to use


def block_layer_ns(tunable: str, before: str, after: str) -> float | None:
    """Mean time per request in the block layer between two readings of a device's `stat`
    file (fields: reads, merges, sectors, ticks ms, writes, merges, sectors, ticks ms, …)."""
    offset = 0 if POINTS[tunable][0] is IOPattern.RANDREAD else 4
    try:
        old, new = [int(v) for v in before.split()], [int(v) for v in after.split()]
        completions = new[offset] - old[offset]
        ticks_ms = new[offset + 3] - old[offset + 3]
    except (ValueError, IndexError):
        return None
    if completions <= 0 or ticks_ms < MIN_TICKS_MS:
        return None
    return ticks_ms * 1e6 / completions


def costs_from(
    results: Mapping[str, fio.FioResult], device_stat: Mapping[str, tuple[str, str]] | None = None
) -> tuple[dict[str, int], str]:
    """Each point's standalone cost in ns, and where it came from: the block layer's time from
    the device's stat readings (before, after) when all four points have a usable one, else
    fio's mean latency for all four (one source, so the points compare). Checked against
    fios' allow-listed range."""
    if set(results) != set(POINTS):
        missing = ", ".join(sorted(set(POINTS) - set(results)))
        raise BenchmarkFailed(f"calibration is missing {missing}")
    block = {
        tunable: block_layer_ns(tunable, *readings)
        for tunable, readings in (device_stat or {}).items()
        if tunable in POINTS
    }
    from_block_layer = len(block) == len(POINTS) and None not in block.values()
    costs = {}
    for tunable, result in results.items():
        ios = sum(task.ios for task in result.tasks)
        if ios == 0:
            raise BenchmarkFailed(f"calibration of {tunable} completed no I/O")
        measured = block[tunable] if from_block_layer else None
        if measured is None:
            measured = sum(t.mean_latency_us * t.ios for t in result.tasks) / ios * 1000
        mean_ns = round(measured)
        low, high = SCHEDULER_TUNABLES[Scheduler.FIOS][tunable]
        if not low < mean_ns <= high:
            raise BenchmarkFailed(f"calibrated {tunable} = {mean_ns} ns is outside ({low}, {high}]")
        costs[tunable] = mean_ns
    flat = monotonic_in_size(costs)
    source = "block layer" if from_block_layer else "fio latency"
    return costs, source + (f"; {', '.join(flat)} charged flat (128 KiB within noise of 4 KiB)"
                            if flat else "")  # fmt: skip


def monotonic_in_size(costs: dict[str, int]) -> list[str]:
    """Makes each direction's 128 KiB cost at least its 4 KiB cost, in place, where it is
    below it by no more than SIZE_NOISE, and returns those directions; refuses the
    calibration (BenchmarkFailed) where it is further below."""
    flat = []
    for direction in ("read", "write"):
        small, large = costs[f"cost_{direction}_4k_ns"], costs[f"cost_{direction}_128k_ns"]
        if large >= small:
            continue
        if large < small * (1 - SIZE_NOISE):
            raise BenchmarkFailed(
                f"calibrated costs do not grow with size: a 128 KiB {direction} measured"
                f" {large} ns, a 4 KiB one {small} ns (fios would charge large requests less"
                " than small ones)"
            )
        costs[f"cost_{direction}_128k_ns"] = small
        flat.append(direction)
    return flat


def measure(
    target: BenchTarget,
    *,
    workdir: Path,
    paths: HostPaths | None = None,
    effects: Effects | None = None,
    seconds: float = 2.0,
    rounds: int = ROUNDS,
) -> Calibration:
    now = datetime.now(UTC).isoformat()
    paths = paths or HostPaths()
    device = target.device or str(target.path)
    if target.holds_data:
        return Calibration(
            device,
            {},
            now,
            (
                f"not calibrated: {target.path} holds data ({'; '.join(target.reasons)}), so its"
                " write costs cannot be measured; fios charges elapsed time / parallelism"
            ),
        )
    stat = paths.block / target.device / "stat" if target.device else None
    specs = workloads(seconds)
    measured: list[tuple[dict[str, int], str]] = []
    failures: list[str] = []
    for _ in range(rounds):
        results, readings = {}, {}
        for tunable, spec in specs.items():  # interleaved: a slow spell touches every point
            before = read_text(stat) if stat else None
            results[tunable] = fio.run(spec, target, effects=effects, workdir=workdir)
            after = read_text(stat) if stat else None
            if before and after:
                readings[tunable] = (before, after)
        try:
            measured.append(costs_from(results, readings))
        except BenchmarkFailed as failed:
            failures.append(str(failed))
    costs, source = least_of(measured, failures)
    summary = ", ".join(f"{k.removeprefix('cost_')}={v}" for k, v in costs.items())
    return Calibration(device, costs, now, f"calibrated on {target.path} ({source}): {summary}")


def least_of(
    measured: list[tuple[dict[str, int], str]], failures: list[str]
) -> tuple[dict[str, int], str]:
    """Each point's least cost over the usable rounds (each from costs_from), and where it came
    from; refuses (BenchmarkFailed) when no round was usable. Rounds of one source only: the
    block layer's where any round had it (fio's latency adds the system call to its time)."""
    if not measured:
        raise BenchmarkFailed(f"no calibration round was usable: {failures[-1]}")
    block = [(costs, source) for costs, source in measured if source.startswith("block layer")]
    kept = block or measured
    # each round is already monotonic in size, so the least of each point is too
    costs = {tunable: min(round_[tunable] for round_, _ in kept) for tunable in POINTS}
    source = "; ".join(dict.fromkeys(part for _, s in kept for part in s.split("; ")))
    rounds = len(measured) + len(failures)
    return costs, f"{source}; least of {len(kept)} usable round(s) of {rounds}"


class CalibrationStore:
    """The last calibration per device, under the agent's state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "calibration"

    def _file(self, device: str) -> Path:
        return self.directory / f"{device}.json"

    def get(self, device: str) -> Calibration | None:
        path = self._file(device)
        if not path.exists():
            return None
        data = read_json(path)
        return Calibration(data["device"], dict(data["costs"]), data["measured_at"], data["note"])

    def put(self, calibration: Calibration) -> None:
        write_json_atomic(self._file(calibration.device), calibration.__dict__)

    def forget(self, device: str) -> bool:
        path = self._file(device)
        if path.exists():
            path.unlink()
            return True
        return False


def with_costs(config: DeviceConfig, calibration: Calibration) -> DeviceConfig:
    """The policy's fios configuration completed with the measured costs and an alpha.
    Values the policy sets itself win over measured ones."""
    if config.scheduler is not Scheduler.FIOS:
        return config
    tunables = {"alpha_permille": DEFAULT_ALPHA_PERMILLE, **calibration.costs}
    tunables.update(config.scheduler_tunables)
    return DeviceConfig.model_validate({**config.model_dump(), "scheduler_tunables": tunables})


def needs_calibration(config: DeviceConfig) -> bool:
    return config.scheduler is Scheduler.FIOS and not set(POINTS) <= set(config.scheduler_tunables)
