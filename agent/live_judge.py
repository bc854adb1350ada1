"""The live canary's judge: what an interval's traffic was (request classes: operation x
request size), each pair's two intervals compared class by class under one fixed mix (the
baseline's over the run), whether the application is closed- or open-loop (which decides
whether a lower I/O rate is harm), and the paired statistics over the pairs.

Why a fixed mix and not "set aside a pair whose mix shifted": an application's own mix moves
between short intervals — MariaDB's page reads, redo writes and doublewrite batches by a total
variation of 0.46-0.59 between 0.5-1 s intervals, against the 0.15 that used to be allowed —
and setting those pairs aside spent 77-91 % of a canary's budget on pairs it threw away. Each
class's latency compared with itself, combined with the same weights in both halves of every
pair, makes a mix shift change how many I/Os stand behind each class, not the verdict."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.collectors.blklat import LatencySnapshot
from agent.contract import histograms
from agent.contract.sli import SLI_METRIC, AppSli
from agent.contract.verdict import (
    MetricRule,
    MetricStatistics,
    levels,
    non_inferiority,
    overall,
    significantly_worse,
)
from agent.contract.wire import CanaryVerdict, IoOperation
from agent.contract.workloads import IOPattern, JobSpec, WorkloadSpec
from agent.telemetry import device_deltas

# What counts as "no worse". A tolerance is the effect that matters, not the noise: the paired
# intervals carry the noise (adjacent 1 s intervals on this 2-core machine under a CPU hog
# differ by about 10 % at p50 in an A/A, yet 40 pairs put an A/A's p50 and p99 shifts within a
# few per cent). p50 keeps twice the synthetic canary's 5 % (the live workload moves under it);
# p99 has the synthetic's 10 %: at 20 %, bfq on CPU-bound db_bench passed its p99 of +9-13 %
# (8 of 8 runs, and CI on 0baa693 passed bfq on it), where A/A p99 shifts stayed within ±0.6 %.
LIVE_RULES = (
    MetricRule("lat_p50_us", higher_is_better=False, tolerance=0.10),
    MetricRule("lat_p99_us", higher_is_better=False, tolerance=0.10),
)
# The data rate each arm served, in bytes per second. On live traffic it is the demand's as much
# as the configuration's, so it cannot make a pass: it can only fail a candidate, and only for
# a closed-loop application (the device sets the pace: a database's workers, db_bench's threads
# issue fewer I/Os when each costs more — block latency alone missed bfq's cost on CPU-bound
# db_bench, whose own p50 rose 28 %). For an open-loop one (clients set the pace) a lower rate
# is not harm. Bytes, not I/Os: a candidate that merges more requests (mq-deadline at
# async_depth 1 cut MariaDB's device I/Os by 21 % at the same bytes, its p99 23 % better) serves
# the same data in fewer I/Os. Not adjusted for load: it is the load.
RATE_RULE = MetricRule("bytes_per_s", higher_is_better=True, tolerance=0.10)
JUDGED = (IoOperation.READ, IoOperation.WRITE)
LoopKind = Literal["closed", "open", "unknown"]

Stratum = tuple[IoOperation, int]  # operation, request-size slot (log2 bytes)


@dataclass(frozen=True)
class LiveSettings:
    # Short intervals, many pairs: the two halves of a pair then share the host's state (on
    # this machine a tmpfs-backed device's median latency wanders by ±30 % over seconds as
    # threads migrate between cores; 0.25 s pairs cancel most of it).
    interval_s: float = 0.25  # the shortest; longer where traffic is thin (see min_ios)
    # the longest: traffic thinner than min_ios in this long (20 I/Os per second) is not judged
    max_interval_s: float = 10.0
    settle_s: float = 0.05  # after a switch: requests queued under the old configuration drain
    pairs: int = 40  # at the first look; then as many more at each look while inconclusive
    # where intervals are long (thin traffic, an application's SLI), the first look comes
    # after about this much traffic instead, and no fewer than min_pairs pairs: a verdict on
    # a quiet database within minutes, not a quarter of an hour
    first_look_s: float = 80.0
    min_pairs: int = 12
    max_pairs: int | None = None  # by default a look every first_look_s, within max_seconds
    # the budget in time: seconds of intervals (both arms) after which the canary takes its
    # last look whatever the pairs — set-aside pairs spend it, and are not counted as pairs
    max_seconds: float = 480.0
    # a pair whose two intervals' I/O rates differ more is set aside; within it, the judge
    # adjusts each pair for the load its halves saw (see `paired`)
    load_ratio: float = 10.0
    min_ios: int = 200  # an interval with fewer completions says nothing
    # what intervals are sized for where the traffic allows. 500 (an interval's p99 on its five
    # slowest I/Os) was measured on MariaDB (bench/results/live_apps.md, 2026-12-02) but made
    # the guard's test slower to trip; the bursts' growth (live_canary.resize) does most of it
    target_ios: int = 200
    min_share: float = 0.02  # classes below this share of the baseline's mix are not judged
    # "closed": a lower data rate under the candidate is harm; "open": it is not (the clients
    # set the pace); "auto": told from the run's intervals, both arms (loop_kind)
    loop: Literal["auto", "closed", "open"] = "auto"
    guard_ratio: float = 3.0  # the candidate's pooled p99 over the baseline's
    guard_p99_us: float | None = None  # or an absolute limit
    guard_checks: int = 4  # guard checks per candidate interval
    # baseline intervals (of min_ios each) before the guard judges: its limit is a multiple
    # of the largest p99 among them but one
    guard_min_intervals: int = 4
    rules: tuple[MetricRule, ...] = LIVE_RULES
    rate_rule: MetricRule | None = RATE_RULE  # can fail a candidate, never pass one
    alpha: float = 0.05
    seed: int | None = None
    # the application's own SLI, judged beside block latency (agent.contract.sli)
    sli: AppSli | None = None

    def judged(self) -> tuple[MetricRule, ...]:
        """The rules the verdict is made of: block latency's, the I/O rate's (which can only
        fail a candidate: `fail_only`), and the SLI's when there is one."""
        rules = self.rules if self.rate_rule is None else (*self.rules, self.rate_rule)
        if self.sli is None:
            return rules
        rule = MetricRule(SLI_METRIC, self.sli.higher_is_better, self.sli.tolerance)
        return (*rules, rule)

    def fail_only(self, sli_measured: bool = True) -> frozenset[str]:
        """Metrics whose failure fails the canary but whose pass is not needed for one: the I/O
        rate's, and block latency's where the SLI decides (while the SLI was measured: an
        endpoint that never answered leaves block latency to decide, as without an SLI)."""
        found = set() if self.rate_rule is None else {self.rate_rule.metric}
        if self.sli is not None and self.sli.decides and sli_measured:
            found |= {rule.metric for rule in self.rules}
        return frozenset(found)


@dataclass(frozen=True)
class Interval:
    arm: str
    strata: dict[Stratum, histograms.Sparse]  # block-layer latency histograms by stratum
    ios: int
    seconds: float
    sli: float | None = None  # the application's SLI over the interval, where one is read
    # the share of the interval in which some task waited for a CPU (/proc/pressure/cpu):
    # a diagnostic of CPU starvation beside the block layer's figures, not judged
    cpu_stall: float | None = None
    bytes: int | None = None  # read and written in the interval (the device's own counters)

    def mix(self) -> dict[Stratum, float]:
        counts = {s: sum(c for _, c in h) for s, h in self.strata.items()}
        total = sum(counts.values()) or 1
        return {s: c / total for s, c in counts.items()}

    def quantile_us(self, q: float, weights: Mapping[Stratum, float] | None = None) -> float:
        shares = weights if weights is not None else self.mix()
        value = histograms.weighted_quantile(
            {s: (shares.get(s, 0.0), h) for s, h in self.strata.items()}, q
        )
        return (value or 0.0) / 1000


def strata_between(device: str, before: LatencySnapshot, after: LatencySnapshot) -> Interval:
    """The interval's block-layer latency histograms (bio submission to completion: a wait
    for a tag and a scheduler's queueing count) by stratum: reads and writes by size class."""
    strata = {
        (op, size): hist
        for (op, kind, size), hist in device_deltas(device, before, after).items()
        if kind == "total_ns" and op in JUDGED
    }
    ios = sum(c for hist in strata.values() for _, c in hist)
    return Interval("", strata, ios, 0.0)


def total_variation(a: Mapping[Stratum, float], b: Mapping[Stratum, float]) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def pair_order(pairs: int, rng: random.Random) -> list[tuple[str, str]]:
    """Balanced and randomised: as many A-first as B-first pairs, in a shuffled order."""
    orders = [("A", "B"), ("B", "A")] * (pairs // 2) + ([("A", "B")] if pairs % 2 else [])
    rng.shuffle(orders)
    return orders


def reference_mix(intervals: Iterable[Interval], min_share: float) -> dict[Stratum, float]:
    """The fixed weights every pair is compared under: the baseline's own mix over the
    intervals given (its I/Os by class), classes below `min_share` left out, the rest adding
    up to 1."""
    counts: dict[Stratum, int] = {}
    for interval in intervals:
        for stratum, hist in interval.strata.items():
            counts[stratum] = counts.get(stratum, 0) + sum(c for _, c in hist)
    total = sum(counts.values())
    if not total:
        return {}
    kept = {s: c / total for s, c in counts.items() if c / total >= min_share}
    norm = sum(kept.values())
    return {s: v / norm for s, v in sorted(kept.items(), key=lambda item: -item[1])}


def pair_values(
    first: Interval, second: Interval, weights: Mapping[Stratum, float], settings: LiveSettings
) -> tuple[dict[str, dict[str, float]] | None, str, list[Stratum]]:
    """Each arm's p50 and p99 with every class weighted as in `weights` (the reference mix),
    over the classes both intervals have: (values, "", classes left out of this pair), or
    (None, why the pair is set aside, []). A class one half lacks is left out of both halves
    — the two are always compared under the same weights — so a pair is set aside only for
    too little traffic, a load that moved tenfold, or no class of the reference mix in both."""
    for interval in (first, second):
        if interval.ios < settings.min_ios:
            return None, f"too little traffic ({interval.ios} I/Os in an interval)", []
    rates = sorted(i.ios / max(i.seconds, 1e-3) for i in (first, second))
    if rates[1] > settings.load_ratio * rates[0]:
        return (
            None,
            (f"load shifted ({rates[0]:.0f} and {rates[1]:.0f} I/Os per second in one pair)"),
            [],
        )
    common = {s: w for s, w in weights.items() if s in first.strata and s in second.strata}
    left_out = [s for s in weights if s not in common]
    if not common:
        return None, "no request class of the reference mix in both intervals", []
    found = {}
    for interval in (first, second):
        found[interval.arm] = {
            "lat_p50_us": interval.quantile_us(0.50, common),
            "lat_p99_us": interval.quantile_us(0.99, common),
        }
        if interval.bytes is not None:
            found[interval.arm][RATE_RULE.metric] = interval.bytes / max(interval.seconds, 1e-3)
    if first.sli is not None and second.sli is not None:
        found[first.arm][SLI_METRIC] = first.sli
        found[second.arm][SLI_METRIC] = second.sli
    return found, "", left_out


def stratum_name(stratum: Stratum) -> str:
    op, slot = stratum
    size = 1 << slot
    return f"{op.value} {size // 1024} KiB" if size >= 1024 else f"{op.value} {size} B"


def class_effects(
    pairs: Sequence[tuple[Interval, Interval]], weights: Mapping[Stratum, float]
) -> dict[str, dict[str, float]]:
    """Per class of the reference mix: its weight, the pairs in which both halves had it, and
    the median over those pairs of the candidate's p50 and p99 against the baseline's
    (relative; positive: the candidate slower) — what a reader needs to see which requests a
    change moved."""
    found: dict[str, dict[str, float]] = {}
    for stratum, weight in weights.items():
        shifts: dict[str, list[float]] = {"p50": [], "p99": []}
        for a, b in pairs:
            if stratum not in a.strata or stratum not in b.strata:
                continue
            for name, q in (("p50", 0.50), ("p99", 0.99)):
                qa = histograms.quantile(a.strata[stratum], q)
                qb = histograms.quantile(b.strata[stratum], q)
                if qa and qb:
                    shifts[name].append(math.log(qb / qa))
        if shifts["p50"]:
            found[stratum_name(stratum)] = {
                "weight": round(weight, 4),
                "pairs": len(shifts["p50"]),
                "p50_shift": round(math.expm1(statistics.median(shifts["p50"])), 4),
                "p99_shift": round(math.expm1(statistics.median(shifts["p99"])), 4)
                if shifts["p99"]
                else math.nan,
            }
    return found


# the intervals needed to tell a closed loop from an open one, and the spread of
# their mean latency (log of the 90th over the 10th percentile) that makes the slope meaningful
LOOP_MIN_INTERVALS = 8
LOOP_MIN_SPREAD = math.log(1.2)


def mean_latency_us(interval: Interval) -> float | None:
    total = count = 0.0
    for hist in interval.strata.values():
        for slot, n in hist:
            low, high = histograms.latency_bounds(slot)
            total += n * (low + high) / 2
            count += n
    return total / count / 1000 if count else None


def loop_kind(baseline: Sequence[Interval]) -> tuple[LoopKind, str]:
    """Whether the application is closed-loop (the device sets its pace) or open-loop (its
    clients do), from the intervals given (the canary gives both arms': where the candidate
    moves the latency, a closed loop's rate follows): by Little's law a closed loop with N
    requests outstanding serves N / latency, so its I/O rate falls as its latency rises
    (a log-log slope near -1); an open loop's rate is the clients', whatever the latency
    (near 0, or rising with it as a queue builds). The Theil-Sen slope of log rate on log
    mean latency decides: <= -0.5 closed, >= -0.2 open, else (or too little spread) unknown."""
    from scipy.stats import theilslopes

    points = []
    for interval in baseline:
        mean = mean_latency_us(interval)
        if mean and interval.ios and interval.seconds > 0:
            points.append((math.log(mean), math.log(interval.ios / interval.seconds)))
    if len(points) < LOOP_MIN_INTERVALS:
        return "unknown", f"{len(points)} baseline intervals, too few to tell"
    xs = sorted(x for x, _ in points)
    spread = xs[(9 * len(xs)) // 10] - xs[len(xs) // 10]
    if spread < LOOP_MIN_SPREAD:
        return "unknown", "the baseline's latency hardly moved: nothing to tell it by"
    slope = float(theilslopes([y for _, y in points], [x for x, _ in points])[0])
    if slope <= -0.5:
        return "closed", f"its I/O rate falls as latency rises (log-log slope {slope:.2f})"
    if slope >= -0.2:
        return "open", f"its I/O rate does not fall as latency rises (log-log slope {slope:.2f})"
    return "unknown", f"log-log slope {slope:.2f}, between a closed and an open loop"


def decided_by(
    verdict: CanaryVerdict, stats: Sequence[MetricStatistics], fail_only: frozenset[str]
) -> str:
    """The rule that decided the verdict, for people: which metric failed (and by how much
    against its tolerance), that every metric held within its tolerance, or which straddle
    it."""

    def said(s: MetricStatistics) -> str:
        word = "gain" if s.relative_shift * (1 if s.higher_is_better else -1) > 0 else "loss"
        return f"{s.metric} {100 * s.relative_shift:+.1f} % ({word})"

    if verdict is CanaryVerdict.FAIL:
        failed = [s for s in stats if s.verdict is CanaryVerdict.FAIL]
        names = {s.metric for s in failed}
        if names <= {RATE_RULE.metric}:
            rule = "the data-rate rule"
        elif names <= {SLI_METRIC}:
            rule = "the application's SLI"
        else:
            rule = "latency"
        return f"decided by {rule}: " + ", ".join(
            f"{said(s)} worse than its tolerance" for s in failed
        )
    if verdict is CanaryVerdict.PASS:
        binding = [s for s in stats if s.metric not in fail_only]
        if [s.metric for s in binding] == [SLI_METRIC]:
            return (
                f"decided by the application's SLI: {said(binding[0])}, its interval within"
                " its tolerance (block latency, which can only fail it here: "
                + ", ".join(said(s) for s in stats if s.metric in fail_only)
                + ")"
            )
        return "decided by equivalence: every metric's interval within its tolerance (" + (
            ", ".join(said(s) for s in binding) + ")"
        )
    open_ = [s for s in stats if s.verdict is CanaryVerdict.INCONCLUSIVE]
    return "undecided: " + (
        ", ".join(f"{said(s)}, its interval straddling the tolerance" for s in open_)
        or "too few pairs"
    )


def describe_workload(device: str, intervals: list[Interval]) -> WorkloadSpec:
    """The observed traffic in the workload language (tool "live"), so the model can learn
    from the verdict like from any canary: read share and request sizes from the histograms."""
    reads = writes = 0
    sizes: dict[int, int] = {}
    for interval in intervals:
        for (op, slot), hist in interval.strata.items():
            n = sum(c for _, c in hist)
            if op is IoOperation.READ:
                reads += n
            else:
                writes += n
            size = max(512, (1 << slot) // 512 * 512)
            sizes[size] = sizes.get(size, 0) + n
    total = reads + writes or 1
    top = sorted(sizes.items(), key=lambda item: -item[1])[:16] or [(4096, 1)]
    weight = sum(n for _, n in top)
    percents = {size: max(1, round(100 * n / weight)) for size, n in top}
    while sum(percents.values()) > 100:  # rounding up the small ones: take it from the largest
        largest = max(percents, key=lambda size: percents[size])
        percents[largest] -= sum(percents.values()) - 100
        percents = {size: p for size, p in percents.items() if p > 0}
    largest = max(percents, key=lambda size: percents[size])
    percents[largest] += 100 - sum(percents.values())
    share = reads / total
    pattern = (
        IOPattern.RANDREAD
        if share == 1.0
        else IOPattern.RANDWRITE
        if share == 0.0
        else IOPattern.RANDRW
    )
    job = JobSpec(name="live", pattern=pattern, read_share=share, block_sizes=percents)
    return WorkloadSpec(name=f"live-{device}"[:128], tool="live", jobs=[job])


# --- the guard's rule: the live canary checks it as a candidate's interval runs -------------


def baseline_tail_us(p99s: Sequence[float], min_intervals: int) -> float | None:
    """The guard's estimate of the baseline's tail from its intervals' p99s: the largest but
    one, once there are `min_intervals` (at least two) of them; None before."""
    if len(p99s) < max(2, min_intervals):
        return None
    return sorted(p99s)[-2]


def guard_limit_us(settings: LiveSettings, tail: float | None) -> tuple[float, float] | None:
    """The p99 (µs) past which a candidate's pooled intervals strike the guard, and the
    baseline tail it comes from: guard_ratio times the tail, or the absolute limit set where
    that is lower; None while there is no tail and no absolute limit."""
    if settings.guard_p99_us is not None:
        relative = settings.guard_ratio * max(tail or 0.0, 1.0)
        limit = min(relative, settings.guard_p99_us) if tail else settings.guard_p99_us
        return limit, tail or 0.0
    if tail is None:
        return None
    return settings.guard_ratio * max(tail, 1.0), tail


def guard_confirm_limit_us(
    settings: LiveSettings, found: tuple[float, float], recent_us: float
) -> tuple[float, str]:
    """The limit a strike is confirmed against, and where it comes from: the larger of the
    baseline tail's and guard_ratio times the baseline's p99 since the strike (where the
    traffic itself got slower, the baseline got slower with it); the absolute limit where
    one is set."""
    limit, tail = found
    ratio = settings.guard_ratio
    source = f"{ratio:g}x the baseline's {tail:.0f}, the largest p99 of its intervals but one"
    if settings.guard_p99_us is None:
        if ratio * recent_us > limit:
            return ratio * recent_us, (
                f"{ratio:g}x the baseline's p99 since the first strike, {recent_us:.0f}"
            )
    elif limit == settings.guard_p99_us:
        source = "the absolute limit set"
    return limit, source


# Fewer comparable pairs than this and there is no verdict to give: inconclusive, whatever
# the samples say (the signed-rank interval of two pairs spans any shift). The canary's looks
# and an audit of its evidence both ask the judge, so the rule is said once, here.
MIN_PAIRS = 3


def judge(
    samples: dict[str, dict[str, list[float]]],
    rules: tuple[MetricRule, ...],
    alpha: float,
    *,
    load: Mapping[str, list[float]] | None = None,
    fail_only: frozenset[str] = frozenset(),
    levels_of: Callable[[float, int], tuple[float, float]] = levels,
) -> tuple[CanaryVerdict, list[MetricStatistics]]:
    """The synthetic canary's judge, on pairs: the i-th A and B samples are one pair's. Each
    pair gives a ratio B/A; the Hodges-Lehmann estimate of the shift is the median of the Walsh
    averages of the log-ratios, with the Wilcoxon signed-rank interval (the paired form of
    Mann-Whitney and Hodges-Lehmann); a slow change of the host's load or the traffic moves
    both halves of a pair alike and cancels. The Mann-Whitney U and its p-value over the two
    arms are reported beside it. With `load` (each pair's I/O rate per arm), each pair's
    log-ratio is adjusted for the load its two halves saw (`load_slope`). A metric in
    `fail_only` fails the verdict when it fails and is otherwise left out of it (the I/O
    rate: RATE_RULE). The levels are `levels`': a pass on each binding metric's one-sided test
    at alpha, a fail Bonferroni-corrected over the metrics a pass needs: counting the rate too
    widened every latency interval and doubled an A/A's time to a verdict on db_bench (median
    75 s against 28), while a fail-only metric adds little to the false fails, since failing
    also takes a shift past its tolerance."""
    usable = [r for r in rules if samples["A"].get(r.metric) and samples["B"].get(r.metric)]
    binding = [r for r in usable if r.metric not in fail_only]
    if not binding:
        raise ValueError("no metric measured in both arms")
    if min(len(samples["A"][r.metric]) for r in binding) < MIN_PAIRS:
        return CanaryVerdict.INCONCLUSIVE, []
    # a fail-only metric measured in too few pairs can fail nothing yet
    usable = [r for r in usable if len(samples["A"][r.metric]) >= MIN_PAIRS]
    to_pass, to_fail = levels_of(alpha, len(binding))
    found = [
        paired(samples, r, to_pass, None if r.metric in fail_only else load, to_fail)
        for r in usable
    ]
    if any(s.verdict is CanaryVerdict.FAIL for s in found if s.metric in fail_only):
        return CanaryVerdict.FAIL, found
    return overall([s for s in found if s.metric not in fail_only]), found


def judge_evidence(
    evidence: Mapping[str, Any],
    pairs: int | None = None,
    levels_of: Callable[[float, int], tuple[float, float]] = levels,
) -> tuple[CanaryVerdict, list[MetricStatistics]]:
    """The verdict this judge gives on a live canary's evidence (`agent canary --evidence`:
    its samples, each pair's I/O rates, the rules and the looks planned) on its first `pairs`
    pairs — all of them by default, which is the look the canary stopped at: an audit of the
    verdict, or what a look at fewer pairs would have said."""
    n = len(evidence["rates"]["A"]) if pairs is None else pairs
    samples = {arm: {m: v[:n] for m, v in evidence["samples"][arm].items()} for arm in "AB"}
    rates = {arm: list(evidence["rates"][arm][:n]) for arm in "AB"}
    rules = tuple(MetricRule(**r) for r in evidence["rules"])
    return judge(
        samples,
        rules,
        evidence["alpha"] / len(evidence["looks_planned"]),
        load=rates,
        fail_only=frozenset(evidence["fail_only"]),
        levels_of=levels_of,
    )


# fewer pairs than this, or a spread of load smaller than this (log of the rates' ratio, at the
# 10th and 90th percentiles), and no slope is fitted: the pairs' own pairing is enough
SLOPE_MIN_PAIRS = 8
SLOPE_MIN_SPREAD = math.log(1.5)


def load_slope(latencies: list[float], rates: list[float]) -> float:
    """How the baseline's latency moves with the load it sees: the Theil-Sen slope of
    log latency on log I/O rate over the baseline's intervals, kept within [0, 2]. Fitted on
    the baseline alone, whose configuration does not change: where the candidate itself
    changes the rate (a slower device serves a closed-loop application fewer I/Os), that
    change is not mistaken for load, and correcting for it can only make a slower candidate
    look slower, never faster."""
    from scipy.stats import theilslopes

    points = [(math.log(r), math.log(v)) for r, v in zip(rates, latencies, strict=True)
              if r > 0 and v > 0]  # fmt: skip
    if len(points) < SLOPE_MIN_PAIRS:
        return 0.0
    xs = sorted(x for x, _ in points)
    if xs[(9 * len(xs)) // 10] - xs[len(xs) // 10] < SLOPE_MIN_SPREAD:
        return 0.0
    slope = float(theilslopes([y for _, y in points], [x for x, _ in points])[0])
    return min(2.0, max(0.0, slope))


def paired(
    samples: dict[str, dict[str, list[float]]],
    rule: MetricRule,
    confidence: float,
    load: Mapping[str, list[float]] | None = None,
    fail_confidence: float | None = None,
) -> MetricStatistics:
    """One metric's paired statistics: the interval at `confidence` (shown) decides a pass,
    and a fail too unless `fail_confidence` names the wider one that does (`levels`)."""
    from scipy.stats import mannwhitneyu, norm

    a, b = samples["A"][rule.metric], samples["B"][rule.metric]
    n = len(a)
    if n < MIN_PAIRS or len(b) != n:
        raise ValueError(f"the live canary needs at least {MIN_PAIRS} complete pairs")
    logs = [math.log(max(y, 1e-9) / max(x, 1e-9)) for x, y in zip(a, b, strict=True)]
    if load is not None and len(load["A"]) == n == len(load["B"]):
        # each pair's B at the load its A saw: log(B/A) - slope * log(rate_B / rate_A)
        slope = load_slope(a, load["A"])
        if slope:
            logs = [
                d - slope * math.log(max(rb, 1e-9) / max(ra, 1e-9))
                for d, ra, rb in zip(logs, load["A"], load["B"], strict=True)
            ]
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
    m = len(walsh)

    def interval(level: float) -> tuple[float, float]:  # Wilcoxon signed-rank, relative
        z = float(norm.ppf(1 - (1 - level) / 2))
        k = math.floor(n * (n + 1) / 4 - z * math.sqrt(n * (n + 1) * (2 * n + 1) / 24))
        k = max(0, min(k, m // 2 - 1))
        return math.expm1(walsh[k]), math.expm1(walsh[m - 1 - k])

    base = statistics.median(a)
    test = mannwhitneyu(b, a, alternative="two-sided")
    relative_shift = math.expm1(statistics.median(walsh))
    low, high = interval(confidence)
    worse = (
        None if fail_confidence is None else significantly_worse(rule, *interval(fail_confidence))
    )
    verdict, relative_worst = non_inferiority(rule, relative_shift, low, high, worse)
    return MetricStatistics(
        rule.metric,
        base,
        statistics.median(b),
        float(test.statistic),
        float(test.pvalue),
        relative_shift * base,
        low * base,
        high * base,
        confidence,
        relative_shift,
        relative_worst,
        verdict,
        rule.higher_is_better,
        fail_confidence,
    )
