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
inconclusive only when the budget is spent. Interval levels are Bonferroni-adjusted for the
number of metrics and of planned looks, so a candidate equal to the baseline fails (or a worse
one passes) no more often than the chosen alpha overall however many looks it takes.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.applier import Applier
from agent.bench.energy import EnergyMeter
from agent.bench.measure import measure
from agent.bench.target import check_allowed, device_target
from agent.contract.tunables import DeviceConfig
from agent.contract.wire import CanaryVerdict
from agent.contract.workloads import WorkloadSpec
from agent.errors import ChangeFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricRule:
    metric: str
    higher_is_better: bool
    tolerance: float  # θ: how much worse (relative) still counts as "not worse"


DEFAULT_RULES = (
    MetricRule("iops", higher_is_better=True, tolerance=0.05),
    MetricRule("lat_p50_us", higher_is_better=False, tolerance=0.05),
    MetricRule("lat_p99_us", higher_is_better=False, tolerance=0.10),
    MetricRule("joules_per_mio", higher_is_better=False, tolerance=0.05),  # when power exists
)


@dataclass(frozen=True)
class MetricStatistics:
    metric: str
    baseline_median: float
    candidate_median: float
    u_statistic: float
    p_value: float
    shift: float  # Hodges-Lehmann, candidate - baseline, in the metric's units
    ci_low: float
    ci_high: float
    confidence: float
    relative_shift: float  # shift / baseline median
    relative_worst: float  # the interval's worse end, relative; > 0 means worse
    verdict: CanaryVerdict

    def as_statistics(self) -> dict[str, float]:
        prefix = self.metric
        return {
            f"{prefix}.baseline_median": self.baseline_median,
            f"{prefix}.candidate_median": self.candidate_median,
            f"{prefix}.u": self.u_statistic,
            f"{prefix}.p_value": self.p_value,
            f"{prefix}.hl_shift": self.shift,
            f"{prefix}.ci_low": self.ci_low,
            f"{prefix}.ci_high": self.ci_high,
            f"{prefix}.confidence": self.confidence,
            f"{prefix}.relative_shift": self.relative_shift,
            f"{prefix}.relative_worst": self.relative_worst,
            f"{prefix}.verdict": {"pass": 0.0, "inconclusive": 0.5, "fail": 1.0}[
                self.verdict.value
            ],
        }


def hodges_lehmann(
    baseline: list[float], candidate: list[float], confidence: float
) -> tuple[float, float, float]:
    """Shift estimate and its distribution-free confidence interval (normal approximation
    for the rank of the interval's ends)."""
    from scipy.stats import norm

    differences = sorted(c - b for c in candidate for b in baseline)
    n, m = len(baseline), len(candidate)
    nm = n * m
    z = float(norm.ppf(1 - (1 - confidence) / 2))
    k = math.floor(nm / 2 - z * math.sqrt(nm * (n + m + 1) / 12))
    k = max(0, min(k, nm // 2 - 1)) if nm > 1 else 0
    return statistics.median(differences), differences[k], differences[nm - 1 - k]


def compare(
    baseline: list[float], candidate: list[float], rule: MetricRule, confidence: float
) -> MetricStatistics:
    from scipy.stats import mannwhitneyu

    if len(baseline) < 3 or len(candidate) < 3:
        raise ValueError("a canary needs at least 3 samples per arm")
    test = mannwhitneyu(candidate, baseline, alternative="two-sided")
    shift, low, high = hodges_lehmann(baseline, candidate, confidence)
    base = statistics.median(baseline)
    scale = abs(base) or 1.0
    relative_shift = shift / scale
    verdict, relative_worst = non_inferiority(rule, relative_shift, low / scale, high / scale)
    return MetricStatistics(
        rule.metric,
        base,
        statistics.median(candidate),
        float(test.statistic),
        float(test.pvalue),
        shift,
        low,
        high,
        confidence,
        relative_shift,
        relative_worst,
        verdict,
    )


def non_inferiority(
    rule: MetricRule, relative_shift: float, relative_low: float, relative_high: float
) -> tuple[CanaryVerdict, float]:
    """The verdict on a shift and its interval (relative to the baseline), and how much worse
    the interval's worse end is (> 0: worse)."""
    sign = -1.0 if rule.higher_is_better else 1.0  # worse is down for iops, up for latency
    worst_end = relative_low if rule.higher_is_better else relative_high
    best_end = relative_high if rule.higher_is_better else relative_low
    relative_worst = sign * worst_end
    significantly_worse = sign * best_end > 0  # the whole interval is on the worse side
    if significantly_worse and sign * relative_shift > rule.tolerance:
        return CanaryVerdict.FAIL, relative_worst
    if relative_worst <= rule.tolerance:
        return CanaryVerdict.PASS, relative_worst
    return CanaryVerdict.INCONCLUSIVE, relative_worst


def overall(per_metric: list[MetricStatistics]) -> CanaryVerdict:
    verdicts = {s.verdict for s in per_metric}
    if CanaryVerdict.FAIL in verdicts:
        return CanaryVerdict.FAIL
    if verdicts == {CanaryVerdict.PASS}:
        return CanaryVerdict.PASS
    return CanaryVerdict.INCONCLUSIVE


def schedule(rounds: int) -> list[str]:
    """Counterbalanced order: A B, B A, A B, … — each arm equally often first."""
    order: list[str] = []
    for r in range(rounds):
        order += ["A", "B"] if r % 2 == 0 else ["B", "A"]
    return order


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


def evaluate(
    samples: dict[str, dict[str, list[float]]],
    rules: tuple[MetricRule, ...],
    alpha: float,
) -> tuple[CanaryVerdict, list[MetricStatistics]]:
    """Statistics for every rule whose metric both arms measured, at a family-wise alpha over
    those metrics (Bonferroni)."""
    usable = [r for r in rules if samples["A"].get(r.metric) and samples["B"].get(r.metric)]
    if not usable:
        raise ValueError("no metric measured in both arms")
    confidence = 1 - alpha / len(usable)
    per_metric = [
        compare(samples["A"][r.metric], samples["B"][r.metric], r, confidence) for r in usable
    ]
    return overall(per_metric), per_metric


@dataclass(frozen=True)
class Budget:
    """When the canary looks: after `rounds` rounds, then every `step` more while the verdict
    is inconclusive, up to `max_rounds`."""

    rounds: int
    max_rounds: int
    step: int

    @classmethod
    def of(cls, rounds: int, max_rounds: int | None = None, step: int | None = None) -> Budget:
        """By default three times the first look's rounds, looking again every `rounds`."""
        if rounds < 3:
            raise ValueError("a canary needs at least 3 rounds")
        limit = 3 * rounds if max_rounds is None else max_rounds
        if limit < rounds:
            raise ValueError(f"max_rounds {limit} is fewer than the first look's {rounds}")
        return cls(rounds, limit, max(1, step or rounds))

    def looks(self) -> list[int]:
        found = [self.rounds]
        while found[-1] < self.max_rounds:
            found.append(min(self.max_rounds, found[-1] + self.step))
        return found


@dataclass
class Sequential:
    verdict: CanaryVerdict
    per_metric: list[MetricStatistics]
    samples: dict[str, dict[str, list[float]]]
    rounds: int
    looks: int


def run_sequential(
    budget: Budget,
    use: Callable[[str], None],
    sample: Callable[[], dict[str, float]],
    rules: tuple[MetricRule, ...],
    alpha: float,
) -> Sequential:
    """Rounds in the counterbalanced order, a look at each of the budget's points; stops at
    the first pass or fail. Each look's intervals are at alpha / the number of planned looks,
    so the error rates hold over all of them (a union bound: no look is free)."""
    planned = budget.looks()
    per_look = alpha / len(planned)
    order = schedule(budget.max_rounds)
    samples: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    done = 0
    for look, rounds in enumerate(planned, start=1):
        for arm in order[2 * done : 2 * rounds]:
            use(arm)
            for metric, value in sample().items():
                samples[arm].setdefault(metric, []).append(value)
        done = rounds
        verdict, per_metric = evaluate(samples, rules, per_look)
        if verdict is not CanaryVerdict.INCONCLUSIVE or look == len(planned):
            return Sequential(verdict, per_metric, samples, rounds, look)
        log.info("canary inconclusive after %d rounds: %d more", rounds, planned[look] - rounds)
    raise AssertionError("unreachable: the last look returns")


def describe(result: CanaryResult) -> list[dict[str, Any]]:
    return [
        {
            "metric": s.metric,
            "baseline": round(s.baseline_median, 3),
            "candidate": round(s.candidate_median, 3),
            "shift_%": round(100 * s.relative_shift, 2),
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
    with applier.device_lock(device):
        return _run_canary(
            applier,
            device,
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
    state = {"arm": "A"}

    def use(arm: str) -> None:
        if arm == state["arm"]:
            return
        if arm == "B":
            applier.apply(device, candidate)
        else:
            applier.rollback(device)
        state["arm"] = arm

    def sample() -> dict[str, float]:
        result = measure(
            run, target, workdir=workdir, meter=meter, effects=applier.effects, with_fairness=False
        )
        return {r.metric: result.metrics[r.metric] for r in rules if r.metric in result.metrics}

    started = time.monotonic()
    try:
        found = run_sequential(budget, use, sample, rules, alpha)
    except BaseException:
        use("A")  # whatever happened, the device goes back to its baseline
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
