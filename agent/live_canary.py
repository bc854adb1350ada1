"""The live canary: baseline (A) and candidate (B) judged on the device's own traffic, for devices
that hold data, where no benchmark may write and a synthetic load would compete with the real one.

The configurations alternate in short intervals, in pairs whose order is drawn at random
(A B, B A, …: balanced, and not in step with any periodic load), every switch through the
applier and its journal; nothing is written to the device. Each interval's eBPF histograms are
its sample. Like is compared with like: the traffic is split into strata (operation x request
size class), and each interval's p50 and p99 are those of the pair's pooled mix — both intervals
of a pair re-weighted to the same shares — so a change of the mix is not read as an effect.
A pair whose two mixes still differ beyond a bound (total variation distance), whose I/O rates
differ by more than a factor, or that lacks a stratum the other has, is set aside and another
pair run instead (up to a limit); the result says how many and why. The judge is the synthetic
canary's in paired form (agent/live_judge.py): Hodges-Lehmann and the Wilcoxon signed-rank
interval on the pairs' log-ratios of interval p50 and p99, Mann-Whitney reported beside them,
with non-inferiority tolerances. Throughput is not judged: on live traffic it is the demand's,
not the configuration's.

Sequential, like the synthetic canary (agent.contract.verdict.Budget): the first look after
`pairs` comparable pairs; while inconclusive, as many more pairs and another look, up to
`max_pairs`; each look at alpha / the planned looks, so the error rates hold over all of them.

A hard guard: when the candidate's p99 over everything it has served so far passes a limit (a
multiple of the baseline's, pooled the same way, or an absolute one) — checked several times
per interval — and the candidate's next interval after a baseline interval, on its own, passes
it again (the limit then also at least the multiple of that baseline's p99: the traffic may
have turned slower for both, 4 KiB reads becoming 64 KiB ones), the canary ends and the
baseline is restored. Pooling, and the second interval, keep one stall of the host or the
disk from ending an A/A (a stall of the host disk tripped a pooled-only guard in 1 of 40 A/A
canaries here), and a change of traffic from tripping it (an A/A whose reads grew from 4 to
64 KiB tripped it when two candidate intervals followed the change); a candidate that is
really bad trips it within its first three intervals.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.applier import Applier
from agent.canary import CanaryResult
from agent.collectors.blklat import BlkLatCollector
from agent.contract import histograms
from agent.contract.tunables import DeviceConfig
from agent.contract.verdict import Budget, MetricStatistics
from agent.contract.wire import CanaryVerdict
from agent.contract.workloads import WorkloadSpec
from agent.errors import AgentError, ChangeFailed
from agent.live_judge import (
    Interval,
    LiveSettings,
    describe_workload,
    judge,
    judge_pair,
    pair_order,
    strata_between,
)

log = logging.getLogger(__name__)

__all__ = ["LiveCanaryUnavailable", "LiveReport", "LiveSettings", "run_live_canary"]


class LiveCanaryUnavailable(AgentError):
    """The live canary cannot run here (no eBPF, or no traffic to judge)."""


@dataclass
class LiveReport:
    """What the live canary saw beyond the verdict's statistics."""

    pairs_used: int = 0
    pairs_set_aside: int = 0
    reasons: list[str] = field(default_factory=list)
    guard_tripped: str = ""
    traffic_seconds: float = 0.0
    ios: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})
    mix: dict[str, float] = field(default_factory=dict)  # pooled, "read/4096" -> share


def run_live_canary(
    applier: Applier,
    device: str,
    candidate: DeviceConfig,
    collector: BlkLatCollector,
    settings: LiveSettings = LiveSettings(),
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[CanaryResult, LiveReport, WorkloadSpec]:
    """Baseline = the device's configuration now. The candidate is kept only on pass; the
    device ends as it began otherwise, which is checked before returning."""
    if not collector.available:
        raise LiveCanaryUnavailable(f"the live canary needs eBPF: {collector.unavailable}")
    with applier.canary(device):
        return _run(applier, device, candidate, collector, settings, sleep)


def _run(
    applier: Applier,
    device: str,
    candidate: DeviceConfig,
    collector: BlkLatCollector,
    settings: LiveSettings,
    sleep: Callable[[float], None],
) -> tuple[CanaryResult, LiveReport, WorkloadSpec]:
    started = time.monotonic()
    rng = random.Random(settings.seed)  # noqa: S311 (an experiment's order, not a secret)
    baseline_scheduler = applier.read(device, "scheduler")
    baseline = applier.current(device) if applier.read(device, "io_poll") != "1" else None
    report = LiveReport()
    state = {"arm": "A"}
    length = {"s": settings.interval_s}

    def use(arm: str) -> None:
        if arm == state["arm"]:
            return
        if arm == "B":
            applier.apply(device, candidate)
        else:
            applier.rollback(device)
        state["arm"] = arm
        sleep(settings.settle_s)

    # everything each arm has served so far, for the guard: a pooled p99 is not moved by
    # one stall of the host or the disk, a candidate that is really bad moves it at once
    pools: dict[str, list[histograms.Sparse]] = {"A": [], "B": []}

    def pooled_p99_us(arm: str, extra: histograms.Sparse | None = None) -> tuple[float, int]:
        merged = histograms.merge([*pools[arm], *([extra] if extra else [])])
        value = histograms.quantile(merged, 0.99)
        return (value or 0.0) / 1000, sum(c for _, c in merged)

    strike = {"interval": -1}  # the candidate interval in which the pooled p99 passed the limit
    # the baseline's intervals measured since the strike: the traffic may have changed (4 KiB
    # reads became 64 KiB), and a candidate is only judged against a baseline that saw it too
    since_strike: list[histograms.Sparse] = []

    def limit_us() -> tuple[float, float] | None:
        """The guard's limit and the baseline's pooled p99; None while there is too little."""
        baseline, baseline_ios = pooled_p99_us("A")
        limit = settings.guard_ratio * max(baseline, 1.0)
        if settings.guard_p99_us is not None:
            return min(limit, settings.guard_p99_us), baseline
        if baseline_ios < settings.guard_min_ios:
            return None  # a p99 of a few hundred I/Os is their maximum: no limit to judge by yet
        return limit, baseline

    def trip(p99: float, ios: int, limit: float, baseline: float, how: str) -> None:
        report.guard_tripped = (
            f"guard: the candidate's p99 reached {p99:.0f} µs over {ios} I/Os {how}"
            f" (limit {limit:.0f} µs: {settings.guard_ratio:g}x the baseline's {baseline:.0f})"
        )
        raise _GuardTripped

    def guard(partial: Interval) -> None:
        found = limit_us()
        if found is None:
            return
        limit, _baseline = found
        p99, ios = pooled_p99_us("B", histograms.merge(partial.strata.values()))
        if ios < settings.guard_min_ios or p99 <= limit:
            return
        if strike["interval"] < 0:
            strike["interval"] = len(pools["B"])  # confirmed, or not, by its next interval
            since_strike.clear()

    def confirm(interval: Interval) -> None:
        """The candidate's first interval after a strike and after a baseline interval that
        followed the strike, on its own: over the limit again ends it. The limit is the
        larger of the pooled baseline's and the baseline's since the strike: where the traffic
        itself got slower (larger requests), the baseline got slower with it."""
        if strike["interval"] < 0 or strike["interval"] >= len(pools["B"]) - 1:
            return
        if not since_strike:
            return  # no baseline has seen the traffic since: the next candidate interval will
        found = limit_us()
        if found is None or interval.ios < settings.min_ios:
            return  # too little to confirm or clear it: the next candidate interval will
        recent = (histograms.quantile(histograms.merge(since_strike), 0.99) or 0.0) / 1000
        baseline = max(found[1], recent)
        limit = found[0]
        if settings.guard_p99_us is None:
            limit = max(limit, settings.guard_ratio * baseline)
        merged = histograms.merge(interval.strata.values())
        p99 = (histograms.quantile(merged, 0.99) or 0.0) / 1000
        if p99 > limit:
            trip(p99, interval.ios, limit, baseline, "and again in its next interval")
        strike["interval"] = -1

    def measure(arm: str) -> Interval:
        """One interval; for the candidate, the guard is checked as it runs."""
        begin = collector.collect(time.time())
        t0 = time.monotonic()
        checks = settings.guard_checks if arm == "B" else 1
        for _ in range(checks):
            sleep(length["s"] / checks)
            if arm == "B":
                guard(strata_between(device, begin, collector.collect(time.time())))
        end = collector.collect(time.time())
        interval = strata_between(device, begin, end)
        seconds = time.monotonic() - t0
        report.traffic_seconds += seconds
        report.ios[arm] += interval.ios
        pools[arm].append(histograms.merge(interval.strata.values()))
        if arm == "B":
            confirm(interval)
        elif strike["interval"] >= 0:
            since_strike.append(pools["A"][-1])
        return Interval(arm, interval.strata, interval.ios, seconds)

    samples: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    used: list[Interval] = []
    verdict_notes: list[str] = []
    budget = Budget.of(settings.pairs, settings.max_pairs)
    planned = budget.looks()
    per_look = settings.alpha / len(planned)
    verdict, per_metric, looks = CanaryVerdict.INCONCLUSIVE, list[MetricStatistics](), 0
    try:
        reference = measure("A")  # the baseline's level, for the guard
        if reference.ios < settings.min_ios:
            raise LiveCanaryUnavailable(
                f"{device} had {reference.ios} I/Os in {settings.interval_s:g} s; the live"
                f" canary needs at least {settings.min_ios} per interval"
            )
        # long enough for min_ios completions per guard check, at the reference's rate
        rate = reference.ios / max(reference.seconds, 1e-3)
        interval_s = min(
            settings.max_interval_s,
            max(settings.interval_s, settings.guard_checks * settings.min_ios / max(rate, 1e-3)),
        )
        length["s"] = interval_s

        for look, target in enumerate(planned, start=1):
            orders = pair_order(max(0, target - report.pairs_used), rng)
            extra = 0
            while orders:
                order = orders.pop(0)
                measured = {}
                for arm in order:
                    use(arm)
                    measured[arm] = measure(arm)
                values, why = judge_pair(measured[order[0]], measured[order[1]], settings)
                if values is None:
                    report.pairs_set_aside += 1
                    report.reasons.append(why)
                    if extra < settings.extra_pairs:
                        extra += 1
                        orders.append(rng.choice([("A", "B"), ("B", "A")]))
                    continue
                report.pairs_used += 1
                used.extend(measured.values())
                for arm, metrics in values.items():
                    for metric, value in metrics.items():
                        samples[arm].setdefault(metric, []).append(value)
            looks = look
            if report.pairs_used >= 3:
                verdict, per_metric = judge(samples, settings.rules, per_look)
                if verdict is not CanaryVerdict.INCONCLUSIVE:
                    break
            if look < len(planned):
                log.info(
                    "live canary inconclusive after %d pairs: %d more",
                    report.pairs_used,
                    planned[look] - report.pairs_used,
                )
    except _GuardTripped:
        use("A")
        _check_restored(applier, device, baseline_scheduler)
        result = CanaryResult(
            CanaryVerdict.FAIL,
            [],
            samples,
            report.pairs_used,
            settings.alpha,
            seconds=time.monotonic() - started,
            kept_candidate=False,
            notes=[report.guard_tripped],
            baseline=baseline,
            budget=budget,
            looks=looks,
        )
        return result, report, describe_workload(device, used)
    except BaseException:
        try:
            use("A")
        finally:
            _check_restored(applier, device, baseline_scheduler)
        raise
    pooled: dict[str, float] = {}
    for interval in used:
        for (op, slot), share in interval.mix().items():
            key = f"{op.value}/{1 << slot}"
            pooled[key] = pooled.get(key, 0.0) + share / len(used)
    report.mix = {k: round(v, 4) for k, v in sorted(pooled.items())}
    rates = [i.ios / max(i.seconds, 1e-3) for i in used]
    if rates and max(rates) > settings.load_ratio * max(min(rates), 1e-3):
        verdict_notes.append(
            f"the load moved between {min(rates):.0f} and {max(rates):.0f} I/Os per second"
            " during the canary; each pair was compared within itself"
        )
    if report.pairs_set_aside:
        verdict_notes.append(
            f"{report.pairs_set_aside} pair(s) set aside: " + "; ".join(sorted(set(report.reasons)))
        )
    if report.pairs_used < 3:
        verdict, per_metric = CanaryVerdict.INCONCLUSIVE, list[MetricStatistics]()
        verdict_notes.append(f"only {report.pairs_used} comparable pair(s): no verdict")
    elif verdict is CanaryVerdict.INCONCLUSIVE:
        verdict_notes.append(
            f"inconclusive after {report.pairs_used} pairs and {looks} look(s): the budget is spent"
        )
    if verdict is CanaryVerdict.PASS:
        use("B")
    else:
        use("A")
        _check_restored(applier, device, baseline_scheduler)
    result = CanaryResult(
        verdict,
        per_metric,
        samples,
        report.pairs_used,
        settings.alpha,
        seconds=time.monotonic() - started,
        kept_candidate=verdict is CanaryVerdict.PASS,
        notes=verdict_notes,
        baseline=baseline,
        budget=budget,
        looks=looks,
    )
    return result, report, describe_workload(device, used)


class _GuardTripped(Exception):
    pass


def _check_restored(applier: Applier, device: str, scheduler: str | None) -> None:
    now = applier.read(device, "scheduler")
    if now != scheduler:
        raise ChangeFailed(
            f"{device}: scheduler is {now!r} after the live canary, not {scheduler!r}",
            restored=False,
        )


def live_statistics(report: LiveReport) -> dict[str, float]:
    """What goes into the observation's statistics beside the judge's."""
    found = {
        "live.pairs_used": float(report.pairs_used),
        "live.pairs_set_aside": float(report.pairs_set_aside),
        "live.traffic_seconds": round(report.traffic_seconds, 3),
        "live.ios_baseline": float(report.ios["A"]),
        "live.ios_candidate": float(report.ios["B"]),
        "live.guard_tripped": 1.0 if report.guard_tripped else 0.0,
    }
    return {k: v for k, v in found.items() if math.isfinite(v)}
