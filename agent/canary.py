"""The canary: is the candidate configuration at least as good as the baseline, here?

Baseline (A) and candidate (B) run the same workload on the same device in counterbalanced
rounds (A B B A A B …), so slow drifts of a shared machine fall on both alike. Each run is one
sample per metric. For every metric that matters, a two-sided Mann-Whitney U test, the
Hodges-Lehmann shift (median of all candidate-minus-baseline differences) and its confidence
interval (Moses' distribution-free interval, as Kayenta reports) are kept. (Not paired by
round: on the lab's loop devices the log-ratio of a round's two runs varies as much as the runs
do — 11-32 % — so pairing buys no precision, and with few rounds it has less power; adjacent
runs under a bursty neighbour are not independent pairs either. The live canary, with 40 short
pairs, is paired: agent/live_judge.py.)

The verdict is one of non-inferiority, per metric with a tolerance θ (relative to the
baseline's median):
- fail: the candidate is significantly worse (the whole interval on the worse side of zero)
  and the shift is worse than θ — a real, material regression;
- pass: even the interval's worst end is within θ — the candidate is shown not to be worse;
- inconclusive: neither, the samples cannot tell.
The canary passes only if every metric passes, fails if any fails.

Sequential, with a bounded budget: the first look comes after `rounds` rounds; while the
verdict is inconclusive more rounds run, and the canary looks again, until `max_rounds` —
inconclusive only when the budget is spent. Each look gets alpha / the planned looks; within a
look a pass is judged at that level per metric (it needs every metric, an intersection-union
test) and a fail Bonferroni-adjusted over the metrics (it needs any one) — agent.contract.
verdict.levels — so a candidate equal to the baseline fails, or one worse than a tolerance
passes, no more often than the chosen alpha overall however many looks it takes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.applier import Applier
from agent.bench.energy import EnergyMeter
from agent.bench.measure import measure
from agent.bench.target import check_allowed, device_target
from agent.contract.tunables import DeviceConfig
from agent.contract.verdict import (
    DEFAULT_RULES,
    Budget,
    MetricRule,
    MetricStatistics,
    run_sequential,
)
from agent.contract.wire import CanaryVerdict
from agent.contract.workloads import WorkloadSpec
from agent.errors import ChangeFailed
from agent.progress import Every, note

log = logging.getLogger(__name__)


@dataclass
class CanaryResult:
    verdict: CanaryVerdict
    per_metric: list[MetricStatistics]
    samples: dict[str, dict[str, list[float]]]  # arm -> metric -> samples
    rounds: int  # run
    alpha: float
    seconds: float = 0.0
    kept_candidate: bool = False
    notes: list[str] = field(default_factory=list)
    # what the baseline arm ran, when that is certain (not on a device that can poll, whose
    # completion mode the queue does not tell): its rounds are a measurement of it too
    baseline: DeviceConfig | None = None
    budget: Budget | None = None  # the sequential canary's: when it looks
    looks: int = 1  # taken

    def statistics(self) -> dict[str, float]:
        found: dict[str, float] = {
            "rounds": float(self.rounds),
            "alpha": self.alpha,
            "wall_seconds": self.seconds,
            "looks": float(self.looks),
        }
        if self.budget is not None:
            found["budget_rounds"] = float(self.budget.max_rounds)
            found["planned_looks"] = float(len(self.budget.looks()))
        for stats in self.per_metric:
            found.update(stats.as_statistics())
        return found


def describe(result: CanaryResult) -> list[dict[str, Any]]:
    return [
        {
            "metric": s.metric,
            "baseline": round(s.baseline_median, 3),
            "candidate": round(s.candidate_median, 3),
            "gain_%": round(100 * s.relative_gain, 2),  # higher is better, as shown everywhere
            "shift_%": round(100 * s.relative_shift, 2),  # candidate against baseline, raw
            "ci": (round(s.ci_low, 3), round(s.ci_high, 3)),
            "p": round(s.p_value, 4),
            "verdict": s.verdict.value,
        }
        for s in result.per_metric
    ]


def run_canary(
    applier: Applier,
    device: str,
    workload: WorkloadSpec,
    candidate: DeviceConfig,
    *,
    workdir: Path,
    rounds: int = 8,
    max_rounds: int | None = None,
    round_seconds: float = 1.0,
    warmup_seconds: float = 0.2,
    rules: tuple[MetricRule, ...] = DEFAULT_RULES,
    alpha: float = 0.05,
    meter: EnergyMeter | None = None,
) -> CanaryResult:
    """Baseline = the device's configuration now. The first look after `rounds` rounds, more
    while inconclusive up to `max_rounds` (three times `rounds` unless given). The candidate is
    kept only on pass; otherwise the device ends as it began, which is checked before
    returning."""
    budget = Budget.of(rounds, max_rounds)
    with applier.canary(device) as baseline_txid:
        return _run_canary(
            applier,
            device,
            baseline_txid,
            workload,
            candidate,
            workdir=workdir,
            budget=budget,
            round_seconds=round_seconds,
            warmup_seconds=warmup_seconds,
            rules=rules,
            alpha=alpha,
            meter=meter,
        )


def _run_canary(
    applier: Applier,
    device: str,
    baseline_txid: str | None,
    workload: WorkloadSpec,
    candidate: DeviceConfig,
    *,
    workdir: Path,
    budget: Budget,
    round_seconds: float,
    warmup_seconds: float,
    rules: tuple[MetricRule, ...],
    alpha: float,
    meter: EnergyMeter | None,
) -> CanaryResult:
    target = device_target(applier.paths, device, applier.effects)
    run = workload.model_copy(update={"duration_s": round_seconds, "warmup_s": warmup_seconds})
    check_allowed(target, run)
    baseline_scheduler = applier.read(device, "scheduler")
    baseline = applier.current(device) if applier.read(device, "io_poll") != "1" else None
    state = {"arm": "A"}  # "?" while switching

    def use(arm: str) -> None:
        if arm == state["arm"]:
            return
        state["arm"] = "?"
        if arm == "B":
            applier.apply(device, candidate)
        else:
            applier.rollback(device)
        state["arm"] = arm

    runs = {"n": 0}
    every = Every(15.0)

    def sample() -> dict[str, float]:
        result = measure(
            run, target, workdir=workdir, meter=meter, effects=applier.effects, with_fairness=False
        )
        runs["n"] += 1
        if every.due():
            note(
                "canary on %s: %d rounds run; first look after %d, at most %d",
                device,
                runs["n"] // 2,
                budget.rounds,
                budget.max_rounds,
            )
        return {r.metric: result.metrics[r.metric] for r in rules if r.metric in result.metrics}

    started = time.monotonic()
    try:
        found = run_sequential(budget, use, sample, rules, alpha)
    except BaseException:
        # whatever happened, wherever a signal landed (mid-switch too), the device goes back
        # to its baseline: by what is recorded as applied
        applier.restore_canary_baseline(device, baseline_txid)
        raise
    keep = found.verdict is CanaryVerdict.PASS
    use("B" if keep else "A")
    result = CanaryResult(
        found.verdict,
        found.per_metric,
        found.samples,
        found.rounds,
        alpha,
        time.monotonic() - started,
        keep,
        baseline=baseline,
        budget=budget,
        looks=found.looks,
    )
    now = applier.read(device, "scheduler")
    expected = candidate.scheduler.value if keep and candidate.scheduler else baseline_scheduler
    if now != expected:
        message = f"{device}: scheduler is {now!r} after the canary, expected {expected!r}"
        raise ChangeFailed(message, restored=False)
    result.notes.append(f"{device} scheduler after the canary: {now}")
    return result
