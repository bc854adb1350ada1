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
with non-inferiority tolerances. The I/O rate each arm served is judged too, but can only fail a
candidate: on live traffic it is the demand's as much as the configuration's, yet with the
pairs' order random and balanced a rate that falls under the candidate in pair after pair is
the candidate's doing (a closed-loop application slowed by it: live_judge.RATE_RULE).

Sequential, like the synthetic canary (agent.contract.verdict.Budget): the first look after
`pairs` comparable pairs; while inconclusive, as many more pairs and another look, up to
`max_pairs`; each look at alpha / the planned looks, so the error rates hold over all of them.

Intervals are as long as the traffic needs: the baseline is first measured in growing
intervals (from `interval_s`, doubling, up to `max_interval_s`) until one holds `min_ios`
completions; traffic thinner than that cannot be judged, and the canary says so
(LiveCanaryUnavailable: the command exits 4, "could not run").

Load: a pair whose halves saw very different I/O rates (beyond `load_ratio`) is set aside;
within that, each pair's log-ratio is adjusted for the load its halves saw, by how the
baseline's own latency moves with load (live_judge.load_slope) — not by discarding the pair.

A hard guard: when the candidate's p99 over everything it has served so far passes a limit — a
multiple of the baseline's own tail (the largest p99 among its intervals but one, once there
are `guard_min_intervals` of them), or an absolute one — checked several times per interval — and
the candidate's next interval after a baseline interval, on its own, passes it again (the limit
then also at least the multiple of that baseline's p99: the traffic may have turned slower for
both, 4 KiB reads becoming 64 KiB ones), the canary ends and the baseline is restored. A limit
from the baseline's intervals' largest p99s, not from their pooled one, keeps bursty traffic
from failing an A/A (a pooled limit from a few calm intervals failed 2 of 3 db_bench A/As);
the largest but one, not the largest, keeps one stall of the host in one baseline interval
from lifting the limit for the whole canary (a 0.25 s interval at 740 µs among ones at ~100
let bfq at 2.5x the baseline run to the end; replayed on the 105 recorded pgbench and db_bench
runs, neither ends an A/A — bench/results/live_canary.md);
pooling on the candidate's side, and the second interval, keep one stall of the host or the
disk from ending an A/A; a candidate that is really bad trips it within its first intervals.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.app_sli import SliReader, SliSnapshot, SliUnavailable
from agent.applier import Applier
from agent.canary import CanaryResult
from agent.collectors.blklat import BlkLatCollector
from agent.collectors.cpu import cpu_pressure_us
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
from agent.progress import Every, note

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
    # each judged pair's I/O rate per arm (I/Os per second): the load the judge adjusts for
    rates: dict[str, list[float]] = field(default_factory=lambda: {"A": [], "B": []})
    # each judged pair's share of time in which some task waited for a CPU, per arm (None
    # without PSI), and its latency histogram (bio submission to completion, all strata
    # merged): what a later judge, or a reader of the verdict, may want beyond the samples
    cpu_stall: dict[str, list[float | None]] = field(default_factory=lambda: {"A": [], "B": []})
    latency: dict[str, list[histograms.Sparse]] = field(default_factory=lambda: {"A": [], "B": []})
    # what it was judged by: each rule (metric, direction, tolerance), and those that can
    # only fail it
    rules: list[dict[str, Any]] = field(default_factory=list)
    fail_only: list[str] = field(default_factory=list)


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
    with applier.canary(device) as baseline_txid:
        canary = _LiveCanary(applier, device, candidate, collector, settings, sleep)
        canary.baseline_txid = baseline_txid
        return canary.run()


def baseline_tail_us(p99s: Sequence[float], min_intervals: int) -> float | None:
    """The guard's estimate of the baseline's tail from its intervals' p99s: the largest but
    one, once there are `min_intervals` (at least two) of them; None before."""
    if len(p99s) < max(2, min_intervals):
        return None
    return sorted(p99s)[-2]


class _LiveCanary:
    """One live canary: the arm the device is on, what each arm has served (for the guard),
    the pairs' samples, and the steps that move between them."""

    def __init__(
        self,
        applier: Applier,
        device: str,
        candidate: DeviceConfig,
        collector: BlkLatCollector,
        settings: LiveSettings,
        sleep: Callable[[float], None],
    ) -> None:
        self.applier, self.device, self.candidate = applier, device, candidate
        self.collector, self.settings, self.sleep = collector, settings, sleep
        self.started = time.monotonic()
        self.rng = random.Random(settings.seed)  # noqa: S311 (an experiment's order)
        self.baseline_scheduler = applier.read(device, "scheduler")
        self.baseline = applier.current(device) if applier.read(device, "io_poll") != "1" else None
        self.report = LiveReport(
            rules=[asdict(r) for r in settings.judged()], fail_only=sorted(settings.fail_only())
        )
        self.arm = "A"  # "?" while switching: a signal then leaves it unknown
        self.baseline_txid: str | None = None  # the applied change the canary began from
        self.length_s = settings.interval_s
        # everything each arm has served so far: the candidate's pooled p99 for the guard
        self.pools: dict[str, list[histograms.Sparse]] = {"A": [], "B": []}
        # each baseline interval's own p99 (µs), where it held enough I/Os: the guard's limit
        # comes from their upper tail, so that bursty traffic the baseline itself shows does
        # not read as the candidate's
        self.baseline_p99s: list[float] = []
        self.strike = -1  # the candidate interval in which the pooled p99 passed the limit
        # the baseline's intervals since the strike: a candidate is only judged against a
        # baseline that saw the same traffic (4 KiB reads may have become 64 KiB ones)
        self.since_strike: list[histograms.Sparse] = []
        self.samples: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
        self.rates = self.report.rates  # each pair's I/O rates
        self.used: list[Interval] = []
        self.budget = Budget.of(settings.pairs, settings.max_pairs)
        self.every = Every(15.0)  # how often a look that takes minutes says where it is
        self.sli = SliReader(settings.sli) if settings.sli is not None else None

    # --- moving between the arms ---------------------------------------------------------

    def use(self, arm: str) -> None:
        if arm == self.arm:
            return
        self.arm = "?"
        if arm == "B":
            self.applier.apply(self.device, self.candidate)
        else:
            self.applier.rollback(self.device)
        self.arm = arm
        self.sleep(self.settings.settle_s)

    def restore(self) -> None:
        """Back to the baseline by what is recorded as applied — right wherever a signal
        landed, in the middle of a switch too."""
        try:
            self.applier.restore_canary_baseline(self.device, self.baseline_txid)
            self.arm = "A"
        finally:
            _check_restored(self.applier, self.device, self.baseline_scheduler)

    # --- the guard -----------------------------------------------------------------------

    def pooled_p99_us(self, arm: str, extra: histograms.Sparse | None = None) -> tuple[float, int]:
        merged = histograms.merge([*self.pools[arm], *([extra] if extra else [])])
        value = histograms.quantile(merged, 0.99)
        return (value or 0.0) / 1000, sum(c for _, c in merged)

    def baseline_tail_us(self) -> float | None:
        """A robust estimate of the baseline's own tail: the largest p99 of its intervals (of
        at least min_ios I/Os each) but one, over at least guard_min_intervals of them — an
        A/A on bursty traffic sees its bursts in the baseline too, and one interval the host
        stalled does not set the limit. None while there are too few."""
        return baseline_tail_us(self.baseline_p99s, self.settings.guard_min_intervals)

    def limit_us(self) -> tuple[float, float] | None:
        """The guard's limit and the baseline tail it comes from; None while there is too
        little to judge by."""
        tail = self.baseline_tail_us()
        if self.settings.guard_p99_us is not None:
            relative = self.settings.guard_ratio * max(tail or 0.0, 1.0)
            limit = (
                min(relative, self.settings.guard_p99_us) if tail else self.settings.guard_p99_us
            )
            return limit, tail or 0.0
        if tail is None:
            return None
        return self.settings.guard_ratio * max(tail, 1.0), tail

    def trip(self, p99: float, ios: int, limit: float, source: str) -> None:
        self.report.guard_tripped = (
            f"guard: the candidate's p99 reached {p99:.0f} µs over {ios} I/Os and again in its"
            f" next interval (limit {limit:.0f} µs: {source})"
        )
        raise _GuardTripped

    def guard(self, partial: Interval) -> None:
        found = self.limit_us()
        if found is None:
            return
        p99, ios = self.pooled_p99_us("B", histograms.merge(partial.strata.values()))
        if ios < self.settings.min_ios or p99 <= found[0]:
            return
        if self.strike < 0:
            self.strike = len(self.pools["B"])  # confirmed, or not, by its next interval
            self.since_strike.clear()

    def confirm(self, interval: Interval) -> None:
        """The candidate's first interval after a strike and after a baseline interval that
        followed the strike, on its own: over the limit again ends it. The limit is the
        larger of the baseline tail's and that of the baseline since the strike: where the
        traffic itself got slower (larger requests), the baseline got slower with it."""
        if self.strike < 0 or self.strike >= len(self.pools["B"]) - 1 or not self.since_strike:
            return
        found = self.limit_us()
        if found is None or interval.ios < self.settings.min_ios:
            return  # too little to confirm or clear it: the next candidate interval will
        recent = (histograms.quantile(histograms.merge(self.since_strike), 0.99) or 0.0) / 1000
        limit, tail = found
        ratio = self.settings.guard_ratio
        source = f"{ratio:g}x the baseline's {tail:.0f}, the largest p99 of its intervals but one"
        if self.settings.guard_p99_us is None:
            if ratio * recent > limit:
                limit = ratio * recent
                source = f"{ratio:g}x the baseline's p99 since the first strike, {recent:.0f}"
        elif limit == self.settings.guard_p99_us:
            source = "the absolute limit set"
        merged = histograms.merge(interval.strata.values())
        p99 = (histograms.quantile(merged, 0.99) or 0.0) / 1000
        if p99 > limit:
            self.trip(p99, interval.ios, limit, source)
        self.strike = -1

    # --- measuring -----------------------------------------------------------------------

    def measure(self, arm: str, length_s: float | None = None) -> Interval:
        """One interval; for the candidate, the guard is checked as it runs."""
        length = length_s if length_s is not None else self.length_s
        sli_begin = self.read_sli()
        stall_begin = cpu_pressure_us(self.applier.paths)
        begin = self.collector.collect(time.time())
        t0 = time.monotonic()
        # The map is read as often in both arms (the guard is only checked in the
        # candidate's): each read costs the application CPU, and on a CPU-bound one (db_bench)
        # reading it only in one arm made that arm slower — an A/A failed on it.
        checks = max(1, self.settings.guard_checks)
        for _ in range(checks):
            self.sleep(length / checks)
            interval = strata_between(self.device, begin, self.collector.collect(time.time()))
            if arm == "B":
                self.guard(interval)
        sli_end = self.read_sli()
        seconds = time.monotonic() - t0
        stall_end = cpu_pressure_us(self.applier.paths)
        self.report.traffic_seconds += seconds
        self.report.ios[arm] += interval.ios
        merged = histograms.merge(interval.strata.values())
        self.pools[arm].append(merged)
        if arm == "B":
            self.confirm(interval)
        else:
            if interval.ios >= self.settings.min_ios:
                self.baseline_p99s.append((histograms.quantile(merged, 0.99) or 0.0) / 1000)
            if self.strike >= 0:
                self.since_strike.append(merged)
        sli = None
        if self.sli is not None and sli_begin is not None and sli_end is not None:
            sli = self.sli.between(sli_begin, sli_end)
        stall = None
        if stall_begin is not None and stall_end is not None:
            stall = round(min(1.0, max(0.0, (stall_end - stall_begin) / 1e6 / seconds)), 4)
        return Interval(arm, interval.strata, interval.ios, seconds, sli, stall)

    def read_sli(self) -> SliSnapshot | None:
        """The application's series now; None (that interval has no SLI) if the endpoint
        fails mid-canary — an application that is busy or restarting is not a verdict."""
        if self.sli is None:
            return None
        try:
            return self.sli.read()
        except SliUnavailable as error:
            log.warning("%s", error)
            return None

    def size_intervals(self) -> None:
        """The baseline's traffic measured in growing intervals — from interval_s, doubling,
        up to max_interval_s — until one holds min_ios I/Os; intervals are then as long as
        that rate needs (with a quarter to spare). Thinner traffic than min_ios in
        max_interval_s cannot be judged: LiveCanaryUnavailable, and why."""
        settings = self.settings
        length = settings.interval_s
        while True:
            reference = self.measure("A", length)
            if reference.ios >= settings.min_ios or length >= settings.max_interval_s:
                break
            length = min(settings.max_interval_s, 2 * length)
        if reference.ios < settings.min_ios:
            raise LiveCanaryUnavailable(
                f"{self.device} had {reference.ios} I/Os in {reference.seconds:.1f} s; the live"
                f" canary needs at least {settings.min_ios} per interval and its intervals last"
                f" at most {settings.max_interval_s:g} s (--max-interval): too little traffic"
                " to judge"
            )
        rate = reference.ios / max(reference.seconds, 1e-3)
        self.length_s = min(
            settings.max_interval_s,
            max(settings.interval_s, 1.25 * settings.min_ios / max(rate, 1e-3)),
        )
        if settings.sli is not None:  # no shorter than the application's metrics can tell
            self.length_s = max(self.length_s, settings.sli.min_interval_s)
        self.budget = budget_for(settings, self.length_s)
        note(
            "live canary on %s: %.0f I/Os per second, intervals of %.2f s; first look after"
            " %d pairs (about %.0f s), at most %d pairs (about %.0f s)",
            self.device,
            rate,
            self.length_s,
            self.budget.rounds,
            2 * self.length_s * self.budget.rounds,
            self.budget.max_rounds,
            2 * self.length_s * self.budget.max_rounds,
        )

    def pair(self, order: tuple[str, str]) -> bool:
        """One pair in the order given; False if it was set aside."""
        measured = {}
        for arm in order:
            self.use(arm)
            measured[arm] = self.measure(arm)
        values, why = judge_pair(measured[order[0]], measured[order[1]], self.settings)
        if self.every.due():
            note(
                "live canary on %s: %d pairs judged, %d set aside",
                self.device,
                self.report.pairs_used + (values is not None),
                self.report.pairs_set_aside + (values is None),
            )
        if values is None:
            self.report.pairs_set_aside += 1
            self.report.reasons.append(why)
            return False
        self.report.pairs_used += 1
        self.used.extend(measured.values())
        for arm, metrics in values.items():
            self.rates[arm].append(measured[arm].ios / max(measured[arm].seconds, 1e-3))
            self.report.cpu_stall[arm].append(measured[arm].cpu_stall)
            self.report.latency[arm].append(histograms.merge(measured[arm].strata.values()))
            for metric, value in metrics.items():
                self.samples[arm].setdefault(metric, []).append(value)
            if self.settings.rate_rule is not None:
                metric = self.settings.rate_rule.metric
                self.samples[arm].setdefault(metric, []).append(self.rates[arm][-1])
        return True

    def looks(self) -> tuple[CanaryVerdict, list[MetricStatistics], int]:
        planned = self.budget.looks()
        per_look = self.settings.alpha / len(planned)
        verdict, per_metric, looks = CanaryVerdict.INCONCLUSIVE, list[MetricStatistics](), 0
        for look, target in enumerate(planned, start=1):
            orders = pair_order(max(0, target - self.report.pairs_used), self.rng)
            extra = 0
            while orders:
                if not self.pair(orders.pop(0)) and extra < self.settings.extra_pairs:
                    extra += 1
                    orders.append(self.rng.choice([("A", "B"), ("B", "A")]))
            looks = look
            if self.report.pairs_used >= 3:
                verdict, per_metric = judge(
                    self.samples,
                    self.settings.judged(),
                    per_look,
                    load=self.rates,
                    fail_only=self.settings.fail_only(),
                )
                if verdict is not CanaryVerdict.INCONCLUSIVE:
                    break
            if look < len(planned):
                note(
                    "live canary on %s: inconclusive after %d pairs (%s); %d more",
                    self.device,
                    self.report.pairs_used,
                    ", ".join(f"{m.metric} {m.relative_shift:+.1%}" for m in per_metric)
                    or "too few to judge",
                    planned[look] - self.report.pairs_used,
                )
        return verdict, per_metric, looks

    def result(
        self,
        verdict: CanaryVerdict,
        per_metric: list[MetricStatistics],
        looks: int,
        notes: list[str],
    ) -> tuple[CanaryResult, LiveReport, WorkloadSpec]:
        result = CanaryResult(
            verdict,
            per_metric,
            self.samples,
            self.report.pairs_used,
            self.settings.alpha,
            seconds=time.monotonic() - self.started,
            kept_candidate=verdict is CanaryVerdict.PASS,
            notes=notes,
            baseline=self.baseline,
            budget=self.budget,
            looks=looks,
        )
        return result, self.report, describe_workload(self.device, self.used)

    def run(self) -> tuple[CanaryResult, LiveReport, WorkloadSpec]:
        try:
            return self._run()
        finally:
            if self.sli is not None:
                self.sli.close()

    def _run(self) -> tuple[CanaryResult, LiveReport, WorkloadSpec]:
        looks = 0
        if self.sli is not None:
            self.sli.read()  # an SLI that cannot be read at all: the canary cannot run
        try:
            self.size_intervals()
            verdict, per_metric, looks = self.looks()
        except _GuardTripped:
            self.restore()
            return self.result(CanaryVerdict.FAIL, [], looks, [self.report.guard_tripped])
        except BaseException:
            self.restore()
            raise
        return self.conclude(verdict, per_metric, looks)

    def conclude(
        self, verdict: CanaryVerdict, per_metric: list[MetricStatistics], looks: int
    ) -> tuple[CanaryResult, LiveReport, WorkloadSpec]:
        report, notes = self.report, []
        pooled: dict[str, float] = {}
        for interval in self.used:
            for (op, slot), share in interval.mix().items():
                key = f"{op.value}/{1 << slot}"
                pooled[key] = pooled.get(key, 0.0) + share / len(self.used)
        report.mix = {k: round(v, 4) for k, v in sorted(pooled.items())}
        rates = [i.ios / max(i.seconds, 1e-3) for i in self.used]
        if rates and max(rates) > 2 * max(min(rates), 1e-3):
            notes.append(
                f"the load moved between {min(rates):.0f} and {max(rates):.0f} I/Os per second"
                " during the canary; each pair was compared within itself, adjusted for the"
                " load its two halves saw"
            )
        if report.pairs_set_aside:
            notes.append(
                f"{report.pairs_set_aside} pair(s) set aside: "
                + "; ".join(sorted(set(report.reasons)))
            )
        if report.pairs_used < 3:
            verdict, per_metric = CanaryVerdict.INCONCLUSIVE, []
            notes.append(f"only {report.pairs_used} comparable pair(s): no verdict")
        elif verdict is CanaryVerdict.INCONCLUSIVE:
            notes.append(
                f"inconclusive after {report.pairs_used} pairs and {looks} look(s): the budget"
                " is spent"
            )
        if verdict is CanaryVerdict.PASS:
            self.use("B")
        else:
            self.restore()
        return self.result(verdict, per_metric, looks, notes)


def budget_for(settings: LiveSettings, length_s: float) -> Budget:
    """`pairs` at the first look, or fewer where intervals are long: as many as fit in
    first_look_s of traffic, at least min_pairs; a budget given (max_pairs) holds."""
    pairs = settings.pairs
    if 2 * length_s * pairs > settings.first_look_s:
        fitting = round(settings.first_look_s / (2 * length_s))
        pairs = max(min(settings.min_pairs, pairs), min(pairs, fitting))
    if settings.max_pairs is not None:
        return Budget.of(min(pairs, settings.max_pairs), settings.max_pairs)
    return Budget.of(pairs)


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
