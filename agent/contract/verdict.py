"""The canary's decision rule, shared by the agent, which decides with it, and the learning
code, which replays canaries with it (models.evaluate): per metric a two-sided Mann-Whitney U
test, the Hodges-Lehmann shift and its distribution-free interval, and a verdict of
non-inferiority against a tolerance; counterbalanced rounds; a sequential budget of looks.
agent/canary.py explains the choices; agent/live_judge.py is the paired form for live traffic.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from agent.contract.wire import CanaryVerdict

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
    higher_is_better: bool  # the metric's direction, so that a reader can state the gain
    # the level of the wider interval a fail was judged on (see `levels`), where it differs
    # from `confidence`'s (whose interval, shown, decides a pass)
    fail_confidence: float | None = None

    @property
    def relative_gain(self) -> float:
        """The change as a gain: higher is better, whatever the metric's direction (a p99
        14 % higher is a gain of -14 %). What every reader is shown: dashboard, API, CLI and
        the agent's evidence, beside the raw shift where that is shown too."""
        return self.relative_shift if self.higher_is_better else -self.relative_shift

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
            f"{prefix}.higher_is_better": float(self.higher_is_better),
        } | (
            {f"{prefix}.fail_confidence": self.fail_confidence}
            if self.fail_confidence is not None
            else {}
        )


def levels(alpha: float, metrics: int) -> tuple[float, float]:
    """The two interval levels of one look at `alpha` (the look's share of the canary's):
    (pass, fail), as two-sided confidences.

    A pass needs every metric's worse end within its tolerance: an intersection-union test,
    each metric's a one-sided test at alpha and none corrected for the others (a candidate
    worse than tolerance on any one metric passes only if that metric's own test errs, with
    chance <= alpha) — the two-sided interval at 1 - 2 alpha, whose worse end is that
    one-sided bound. A fail needs one metric significantly worse: a union, so Bonferroni over
    the metrics, 1 - alpha / metrics (the interval's better end a one-sided bound at alpha / 2
    metrics). Until 2026-11-26 one interval at 1 - alpha / metrics decided both: a pass was
    held to four to six times the error it is allowed, and pgbench's A/As needed 40-60 pairs
    where 20-40 now decide (bench/results/live_apps.md)."""
    return 1 - 2 * alpha, 1 - alpha / metrics


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
    baseline: list[float],
    candidate: list[float],
    rule: MetricRule,
    confidence: float,
    fail_confidence: float | None = None,
) -> MetricStatistics:
    """One metric's statistics and verdict: the interval at `confidence` (shown) decides a
    pass, and a fail too unless `fail_confidence` names the wider one that does (`levels`)."""
    from scipy.stats import mannwhitneyu

    if len(baseline) < 3 or len(candidate) < 3:
        raise ValueError("a canary needs at least 3 samples per arm")
    test = mannwhitneyu(candidate, baseline, alternative="two-sided")
    shift, low, high = hodges_lehmann(baseline, candidate, confidence)
    base = statistics.median(baseline)
    scale = abs(base) or 1.0
    relative_shift = shift / scale
    worse = None
    if fail_confidence is not None:
        _, fail_low, fail_high = hodges_lehmann(baseline, candidate, fail_confidence)
        worse = significantly_worse(rule, fail_low / scale, fail_high / scale)
    verdict, relative_worst = non_inferiority(
        rule, relative_shift, low / scale, high / scale, worse
    )
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
        rule.higher_is_better,
        fail_confidence,
    )


def significantly_worse(rule: MetricRule, relative_low: float, relative_high: float) -> bool:
    """The whole interval on the worse side of zero."""
    return (-relative_high if rule.higher_is_better else relative_low) > 0


def non_inferiority(
    rule: MetricRule,
    relative_shift: float,
    relative_low: float,
    relative_high: float,
    worse: bool | None = None,
) -> tuple[CanaryVerdict, float]:
    """The verdict on a shift and its interval (relative to the baseline), and how much worse
    the interval's worse end is (> 0: worse). `worse`: whether a wider interval found the
    candidate significantly worse (`levels`); by default this interval decides that too."""
    sign = -1.0 if rule.higher_is_better else 1.0  # worse is down for iops, up for latency
    worst_end = relative_low if rule.higher_is_better else relative_high
    relative_worst = sign * worst_end
    if worse is None:
        worse = significantly_worse(rule, relative_low, relative_high)
    if worse and sign * relative_shift > rule.tolerance:
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


def evaluate(
    samples: dict[str, dict[str, list[float]]],
    rules: tuple[MetricRule, ...],
    alpha: float,
) -> tuple[CanaryVerdict, list[MetricStatistics]]:
    """Statistics for every rule whose metric both arms measured: a pass at alpha (each
    metric's one-sided test), a fail at a family-wise alpha over those metrics (`levels`)."""
    usable = [r for r in rules if samples["A"].get(r.metric) and samples["B"].get(r.metric)]
    if not usable:
        raise ValueError("no metric measured in both arms")
    to_pass, to_fail = levels(alpha, len(usable))
    per_metric = [
        compare(samples["A"][r.metric], samples["B"][r.metric], r, to_pass, to_fail) for r in usable
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
