"""The live canary: baseline (A) and candidate (B) judged on the device's own traffic, for devices
that hold data, where no benchmark may write and a synthetic load would compete with the real one.

The configurations alternate in short intervals, in pairs whose order is drawn at random
(A B, B A, …: balanced, and not in step with any periodic load), every switch through the
applier and its journal; nothing is written to the device. Each interval's eBPF histograms are
its sample. Like is compared with like: the traffic is split into request classes (operation x
request size), and both intervals of every pair are read under one fixed mix — the baseline's
own over the run, fixed at the first look (live_judge.reference_mix) — so that a change of the
mix changes how many I/Os stand behind each class, not the verdict. A class one half of a pair
lacks is left out of that pair, in both halves; a pair is set aside only for too little
traffic, a load that moved tenfold, or no class in common (the result counts each, and why).
The judge is the synthetic canary's in paired form (agent/live_judge.py): Hodges-Lehmann and
the Wilcoxon signed-rank interval on the pairs' log-ratios of interval p50 and p99, Mann-Whitney
reported beside them; a pass is an equivalence decision — every metric's interval within its
tolerance — and "inconclusive" is for an effect whose interval straddles it when the budget is
spent. The data rate each arm served (bytes per second) is judged too, but can only fail a
candidate, and only where the application is closed-loop (the device sets its pace): told
from the run's intervals, both arms (live_judge.loop_kind), or set by the policy; for an
open-loop one (its clients set the pace) a lower rate is not harm. The verdict's first note
names the rule that decided it.

Sequential, like the synthetic canary (agent.contract.verdict.Budget): the first look after
`pairs` comparable pairs; while inconclusive, as many more pairs and another look, up to
`max_pairs`; each look at alpha / the planned looks, so the error rates hold over all of them.
The budget is also time: `max_seconds` of intervals, which pairs set aside spend too; when it is
spent the canary takes its last look.

Intervals follow the traffic: the baseline is first measured in growing intervals (from
`interval_s`, doubling, up to `max_interval_s`) until one holds `min_ios` completions (traffic
thinner than that cannot be judged: LiveCanaryUnavailable, "could not run", exit 4); after every
pair the length is set again from the median I/O rate of the last eight intervals — never from
one start-up burst — and doubled after a pair too thin to judge.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agent.app_sli import SliReader, SliSnapshot, SliUnavailable
from agent.applier import Applier
from agent.canary import CanaryResult
from agent.collectors.blklat import BlkLatCollector
from agent.collectors.cpu import cpu_pressure_us
from agent.contract import histograms
from agent.contract.sli import SLI_METRIC
from agent.contract.tunables import DeviceConfig
from agent.contract.verdict import Budget, MetricStatistics
from agent.contract.wire import CanaryVerdict
from agent.contract.workloads import WorkloadSpec
from agent.errors import AgentError, ChangeFailed
from agent.live_judge import (
    MIN_PAIRS,
    Interval,
    LiveSettings,
    Stratum,
    baseline_tail_us,
    class_effects,
    decided_by,
    describe_workload,
    guard_confirm_limit_us,
    guard_limit_us,
    judge,
    loop_kind,
    pair_order,
    pair_values,
    reference_mix,
    strata_between,
    stratum_name,
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
    # the fixed weights every pair was compared under (the baseline's mix: "read 16 KiB" ->
    # share), each class's own effect, and in how many pairs a class was left out because
    # one half had none of it
    weights: dict[str, float] = field(default_factory=dict)
    classes: dict[str, dict[str, float]] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)
    # closed (the device sets the pace: a lower data rate is harm), open, or unknown; and why
    loop: str = ""
    loop_why: str = ""
    interval_s: list[float] = field(default_factory=list)  # each interval length used
    # requests the device completed (its stat: reads and writes) from the first interval's
    # start to the last's end: every one should be in some interval, the slow ones a switch
    # drains too (a third went uncounted, most of them the candidate's, before intervals
    # ended on their switch)
    completed: int = 0
    settling: int = 0  # of those, the ones that completed while a switch settled


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
        # every pair with enough traffic, as (baseline, candidate): judged under `weights`,
        # the reference mix fixed at the first look (so a pair's values never change after)
        self.kept: list[tuple[Interval, Interval]] = []
        self.weights: dict[Stratum, float] | None = None
        self.judging = settings  # the rules as judged: without the rate rule for an open loop
        self.recent: list[float] = []  # the last intervals' I/O rates: what sizes the next
        self.last: list[Interval] = []  # the last intervals: their classes, for the same
        self.floor_s = 0.0  # the shortest interval the traffic's bursts allow
        self.sized_from: list[Interval] = []  # the baseline's sizing intervals
        self.budget = Budget.of(settings.pairs, settings.max_pairs)
        self.completions_from: int | None = None  # the device's stat at the first interval
        self.every = Every(15.0)  # how often a look that takes minutes says where it is
        self.sli = SliReader(settings.sli) if settings.sli is not None else None

    # --- moving between the arms ---------------------------------------------------------

    def use(self, arm: str) -> None:
        if arm == self.arm:
            return
        self.switch(arm)
        self.sleep(self.settings.settle_s)

    def switch(self, arm: str) -> None:
        """The write alone. Changing the scheduler freezes the queue until every request in it
        has completed, and the write returns after that: what completes during it was issued
        under the arm left."""
        self.arm = "?"
        if arm == "B":
            self.applier.apply(self.device, self.candidate)
        else:
            self.applier.rollback(self.device)
        self.arm = arm

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
        """The guard's limit and the baseline tail it comes from (the judge's rule:
        `guard_limit_us`); None while there is too little to judge by."""
        return guard_limit_us(self.settings, self.baseline_tail_us())

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
        limit, source = guard_confirm_limit_us(self.settings, found, recent)
        merged = histograms.merge(interval.strata.values())
        p99 = (histograms.quantile(merged, 0.99) or 0.0) / 1000
        if p99 > limit:
            self.trip(p99, interval.ios, limit, source)
        self.strike = -1

    # --- measuring -----------------------------------------------------------------------

    def measure(self, arm: str, length_s: float | None = None, then: str | None = None) -> Interval:
        """One interval; for the candidate, the guard is checked as it runs. With `then`, the
        interval ends by switching to that arm: a switch freezes the queue until every request
        in it completes, and those requests — the slowest of an arm that holds requests back,
        as an idling scheduler does — are counted in the interval that issued them, not lost
        between two intervals."""
        if self.arm != arm:
            self.switch(arm)
            self.settle()
        length = length_s if length_s is not None else self.length_s
        if self.completions_from is None:
            self.completions_from = self.device_completions()
        sli_begin = self.read_sli()
        stall_begin = cpu_pressure_us(self.applier.paths)
        bytes_begin = self.device_bytes()
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
        switched = then is not None and then != arm
        if switched:
            assert then is not None
            # the requests the switch drains — an idling scheduler's slowest, held back — were
            # issued under this arm and count in its interval; the next arm's settling, after
            # the write, counts in neither
            self.switch(then)
            interval = strata_between(self.device, begin, self.collector.collect(time.time()))
            if arm == "B":
                self.guard(interval)
        completions = self.device_completions()
        if completions is not None and self.completions_from is not None:
            self.report.completed = completions - self.completions_from
        sli_end = self.read_sli()
        seconds = time.monotonic() - t0
        bytes_end = self.device_bytes()
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
        moved = None if bytes_begin is None or bytes_end is None else bytes_end - bytes_begin
        self.report.interval_s.append(round(seconds, 3))
        found = Interval(arm, interval.strata, interval.ios, seconds, sli, stall, moved)
        if arm == "A":  # the traffic as the baseline serves it: a bad candidate's own slowness
            # must not stretch the intervals (nor the guard's baseline with them)
            self.recent = [*self.recent[-7:], interval.ios / max(seconds, 1e-3)]
            self.last = [*self.last[-7:], found]
        if switched:
            self.settle()
        return found

    def settle(self) -> None:
        """The wait after a switch, between two intervals: what completes in it is counted
        (report.settling) so that what no interval counted and no settling explains — requests
        lost between intervals — can be told apart."""
        before = self.device_completions() if self.completions_from is not None else None
        self.sleep(self.settings.settle_s)
        after = self.device_completions() if before is not None else None
        if before is not None and after is not None:
            self.report.settling += after - before

    def device_completions(self) -> int | None:
        """Reads and writes the device has completed since it appeared (its stat)."""
        from agent.host import read_text

        text = read_text(self.applier.paths.block / self.device / "stat")
        fields = text.split() if text else []
        if len(fields) < 5 or not (fields[0].isdigit() and fields[4].isdigit()):
            return None
        return int(fields[0]) + int(fields[4])

    def device_bytes(self) -> int | None:
        """Bytes the device has read and written since it appeared (its stat's sectors)."""
        from agent.host import read_text

        text = read_text(self.applier.paths.block / self.device / "stat")
        fields = text.split() if text else []
        if len(fields) < 7 or not (fields[2].isdigit() and fields[6].isdigit()):
            return None
        return 512 * (int(fields[2]) + int(fields[6]))

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
            self.sized_from.append(reference)
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
            max(settings.interval_s, 1.25 * target_ios(settings) / max(rate, 1e-3)),
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

    def resize(self, starved: bool) -> None:
        """The next intervals' length from the traffic now, never from one start-up burst:
        long enough that each holds target_ios I/Os (min_ios at least) at the lower quartile
        of the last eight baseline intervals' rates (with half again to spare); doubled after a pair
        too thin to judge,
        and doubled — never to shrink below that again — while a class that carries a tenth of
        the traffic is missing from more than a fifth of those intervals: a database's
        flushes come in bursts, and an interval shorter than their period reads a burst's
        tail as the configuration's."""
        settings = self.settings
        rates = sorted(self.recent)
        rate = rates[len(rates) // 4] if rates else 0.0
        wanted = 1.5 * target_ios(settings) / max(rate, 1e-3)
        if starved:
            wanted = max(wanted, 2 * self.length_s)
        if self.bursty():  # and never shorter again: the bursts do not go away
            self.floor_s = min(settings.max_interval_s, 2 * self.length_s)
            self.last.clear()  # judged again on eight intervals of the new length
        wanted = max(wanted, self.floor_s)
        self.length_s = min(settings.max_interval_s, max(settings.interval_s, wanted))
        if settings.sli is not None:
            self.length_s = max(self.length_s, settings.sli.min_interval_s)

    def bursty(self) -> bool:
        """Whether a class of a tenth of the traffic or more is missing from more than a fifth
        of the last eight intervals."""
        recent = self.last[-8:]
        if len(recent) < 8:
            return False
        counts: dict[Stratum, int] = {}
        present: dict[Stratum, int] = {}
        for interval in recent:
            for stratum, hist in interval.strata.items():
                counts[stratum] = counts.get(stratum, 0) + sum(c for _, c in hist)
                present[stratum] = present.get(stratum, 0) + 1
        total = sum(counts.values()) or 1
        return any(
            count / total >= 0.1 and present[stratum] < 0.8 * len(recent)
            for stratum, count in counts.items()
        )

    def pair(self, order: tuple[str, str], following: str = "A") -> bool:
        """One pair in the order given, each interval ending on the switch to the arm measured
        next (`following`: the next pair's first); False if it was set aside."""
        measured = {}
        for arm, then in zip(order, (order[1], following), strict=True):
            measured[arm] = self.measure(arm, then=then)
        first, second = measured[order[0]], measured[order[1]]
        weights = self.weights or {s: 1.0 for s in {*first.strata, *second.strata}}
        values, why, _ = pair_values(first, second, weights, self.settings)
        self.resize(starved=why.startswith("too little traffic"))
        if self.every.due():
            note(
                "live canary on %s: %d pairs judged, %d set aside; intervals of %.2f s",
                self.device,
                len(self.kept) + (values is not None),
                self.report.pairs_set_aside + (values is None),
                self.length_s,
            )
        if values is None:
            self.report.pairs_set_aside += 1
            self.report.reasons.append(why)
            return False
        self.kept.append((measured["A"], measured["B"]))
        if self.weights is not None:
            self.sample(measured["A"], measured["B"])
        return True

    def freeze(self) -> None:
        """At the first look: the reference mix (the baseline's, over every baseline interval
        so far) and the kind of loop the application is, fixed for the rest of the canary;
        the pairs so far judged under them."""
        baseline = [a for a, _ in self.kept] + self.sized_from
        self.weights = reference_mix(baseline, self.settings.min_share)
        self.report.weights = {stratum_name(s): round(w, 4) for s, w in self.weights.items()}
        # both arms: a closed loop shows itself where the candidate moves the latency (four
        # readers thinking 500 µs between reads barely move theirs in the baseline)
        measured = baseline + [b for _, b in self.kept]
        kind, why = (
            (self.settings.loop, "as the policy says")
            if self.settings.loop != "auto"
            else loop_kind(measured)
        )
        self.report.loop, self.report.loop_why = kind, why
        if kind == "open":
            self.judging = replace(self.settings, rate_rule=None)
        self.report.rules = [asdict(r) for r in self.judging.judged()]
        self.report.fail_only = sorted(self.judging.fail_only())
        kept, self.kept = self.kept, []
        for a, b in kept:
            values, why, _ = pair_values(a, b, self.weights, self.settings)
            if values is None:
                self.report.pairs_set_aside += 1
                self.report.reasons.append(why)
                continue
            self.kept.append((a, b))
            self.sample(a, b)

    def sample(self, a: Interval, b: Interval) -> None:
        """A kept pair's values under the reference mix, appended to the samples."""
        assert self.weights is not None
        values, _, left_out = pair_values(a, b, self.weights, self.settings)
        assert values is not None
        self.report.pairs_used += 1
        self.used.extend((a, b))
        for stratum in left_out:
            name = stratum_name(stratum)
            self.report.left_out[name] = self.report.left_out.get(name, 0) + 1
        for arm, interval in (("A", a), ("B", b)):
            self.rates[arm].append(interval.ios / max(interval.seconds, 1e-3))
            self.report.cpu_stall[arm].append(interval.cpu_stall)
            self.report.latency[arm].append(histograms.merge(interval.strata.values()))
            for metric, value in values[arm].items():
                self.samples[arm].setdefault(metric, []).append(value)

    def fail_only(self) -> frozenset[str]:
        """The metrics that can fail the candidate but are not needed to pass it, as judged
        now: block latency's too where the SLI decides and has been measured."""
        found = self.judging.fail_only(bool(self.samples["A"].get(SLI_METRIC)))
        self.report.fail_only = sorted(found)
        return found

    def out_of_time(self) -> bool:
        return self.report.traffic_seconds >= self.settings.max_seconds

    def looks(self) -> tuple[CanaryVerdict, list[MetricStatistics], int]:
        """Pairs until each planned look's count is judged — set-aside pairs are replaced, and
        spend the time budget (max_seconds) rather than a count of attempts — then a look; the
        budget spent, one last look at what there is."""
        planned = self.budget.looks()
        per_look = self.settings.alpha / len(planned)
        verdict, per_metric, looks = CanaryVerdict.INCONCLUSIVE, list[MetricStatistics](), 0
        for look, target in enumerate(planned, start=1):
            while len(self.kept) < target and not self.out_of_time():
                orders = pair_order(max(2, target - len(self.kept)), self.rng)
                while orders and len(self.kept) < target and not self.out_of_time():
                    self.pair(orders.pop(0), orders[0][0] if orders else "A")
            if self.weights is None:
                self.freeze()
            looks = look
            if self.kept:
                verdict, per_metric = judge(
                    self.samples,
                    self.judging.judged(),
                    per_look,
                    load=self.rates,
                    fail_only=self.fail_only(),
                )
                if verdict is not CanaryVerdict.INCONCLUSIVE:
                    break
            if self.out_of_time():
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
            said = self.report.guard_tripped.removeprefix("guard: ")
            return self.result(CanaryVerdict.FAIL, [], looks, [f"decided by the guard: {said}"])
        except BaseException:
            self.restore()
            raise
        return self.conclude(verdict, per_metric, looks)

    def conclude(
        self, verdict: CanaryVerdict, per_metric: list[MetricStatistics], looks: int
    ) -> tuple[CanaryResult, LiveReport, WorkloadSpec]:
        report = self.report
        pooled: dict[str, float] = {}
        for interval in self.used:
            for (op, slot), share in interval.mix().items():
                key = f"{op.value}/{1 << slot}"
                pooled[key] = pooled.get(key, 0.0) + share / len(self.used)
        report.mix = {k: round(v, 4) for k, v in sorted(pooled.items())}
        if self.weights:
            report.classes = class_effects(self.kept, self.weights)
        notes = [self.decision(verdict, per_metric, looks), *self.evidence_lines(per_metric)]
        if verdict is CanaryVerdict.PASS:
            self.use("B")
        else:
            self.restore()
        return self.result(verdict, per_metric, looks, notes)

    def decision(
        self, verdict: CanaryVerdict, per_metric: list[MetricStatistics], looks: int
    ) -> str:
        """The verdict's first note: the rule that decided it, after how many pairs."""
        report = self.report
        if report.pairs_used < MIN_PAIRS:
            return f"undecided: only {report.pairs_used} comparable pair(s) in the budget"
        said = decided_by(verdict, per_metric, self.fail_only())
        if verdict is CanaryVerdict.INCONCLUSIVE:
            spent = "time" if self.out_of_time() else "pairs"
            said += f"; the budget ({spent}) is spent"
        return f"{said} — {report.pairs_used} pairs, {looks} look(s)"

    def evidence_lines(self, per_metric: list[MetricStatistics]) -> list[str]:
        """What a reader needs beside the verdict, a line each: the data-rate rule and why,
        the reference mix with each class's effect, what was set aside or left out and why,
        the load, and where the arms' medians and the paired shift disagree."""
        report, lines = self.report, []
        rate = "applied" if self.judging.rate_rule is not None else "not applied"
        lines.append(
            f"data-rate rule {rate}: {report.loop or 'unknown'} loop ({report.loop_why})"
            if report.loop
            else f"data-rate rule {rate}"
        )
        if report.classes:
            lines.append(
                "per class (weight; p50 and p99 gain, higher is better): "
                + "; ".join(
                    f"{name} {100 * c['weight']:.0f} %: {-100 * c['p50_shift']:+.1f} % /"
                    f" {-100 * c['p99_shift']:+.1f} %"
                    for name, c in report.classes.items()
                )
            )
        if report.pairs_set_aside:
            counts: dict[str, int] = {}
            for why in report.reasons:
                kind = why.split(" (")[0]
                counts[kind] = counts.get(kind, 0) + 1
            lines.append(
                f"{report.pairs_set_aside} pair(s) set aside: "
                + "; ".join(f"{kind} ({n})" for kind, n in sorted(counts.items()))
            )
        if report.left_out:
            lines.append(
                "classes one half of a pair lacked, left out of that pair (both halves): "
                + "; ".join(f"{name} in {n} pair(s)" for name, n in report.left_out.items())
            )
        rates = [i.ios / max(i.seconds, 1e-3) for i in self.used]
        if rates and max(rates) > 2 * max(min(rates), 1e-3):
            lines.append(
                f"the load moved between {min(rates):.0f} and {max(rates):.0f} I/Os per second;"
                " each pair was compared within itself, adjusted for the load its halves saw"
            )
        for stats in per_metric:
            medians = stats.candidate_median - stats.baseline_median
            if medians * stats.relative_shift < 0 and abs(stats.relative_shift) > 0.02:
                lines.append(
                    f"{stats.metric}: the arms' medians differ the other way from the paired"
                    f" shift ({100 * stats.relative_shift:+.1f} %): the shift compares each pair"
                    " within itself, so the host's drift cancels; the medians do not"
                )
        return lines


def target_ios(settings: LiveSettings) -> int:
    return max(settings.min_ios, settings.target_ios)


def budget_for(settings: LiveSettings, length_s: float) -> Budget:
    """Looks shaped by time: the first after about first_look_s of traffic (`pairs` where
    intervals are short, fewer where they are long, never fewer than min_pairs), then one
    every as many pairs more, as many as max_seconds holds (six by default); a budget given
    in pairs (max_pairs) holds. The time budget itself (max_seconds) ends the canary
    whatever the looks."""
    pairs = settings.pairs
    if 2 * length_s * pairs > settings.first_look_s:
        fitting = round(settings.first_look_s / (2 * length_s))
        pairs = max(min(settings.min_pairs, pairs), min(pairs, fitting))
    if settings.max_pairs is not None:
        return Budget.of(min(pairs, settings.max_pairs), settings.max_pairs)
    looks = max(1, int(settings.max_seconds // max(settings.first_look_s, 1e-3)))
    return Budget.of(pairs, max(pairs, 3 * pairs if looks < 3 else looks * pairs))


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
    """What goes into the observation's statistics beside the judge's: the pairs, the traffic,
    the guard; the loop (1 closed, 0 open, 0.5 unknown) and whether the data-rate rule
    applied; each class's weight and effect (`live.class.read_16KiB.p50_shift`), and the pairs
    set aside by reason and classes left out (`live.set_aside.too_little_traffic`) — what the
    dashboard shows of a live canary, a line each."""
    found = {
        "live.pairs_used": float(report.pairs_used),
        "live.pairs_set_aside": float(report.pairs_set_aside),
        "live.traffic_seconds": round(report.traffic_seconds, 3),
        "live.ios_baseline": float(report.ios["A"]),
        "live.ios_candidate": float(report.ios["B"]),
        "live.guard_tripped": 1.0 if report.guard_tripped else 0.0,
    }
    if report.completed:
        # the device's completions no interval counted and no settling explains (requests
        # lost between intervals, as a switch's drain was before it ended the interval)
        counted = report.ios["A"] + report.ios["B"] + report.settling
        found["live.uncounted_share"] = round(
            max(0, report.completed - counted) / report.completed, 4
        )
    if report.loop:
        found["live.loop_closed"] = {"closed": 1.0, "open": 0.0}.get(report.loop, 0.5)
        found["live.data_rate_rule"] = 1.0 if "bytes_per_s" in report.fail_only else 0.0
    for name, effect in list(report.classes.items())[:12]:
        slug = _slug(name)
        for key in ("weight", "pairs", "p50_shift", "p99_shift"):
            found[f"live.class.{slug}.{key}"] = float(effect[key])
    for why in report.reasons:
        key = f"live.set_aside.{_slug(why.split(' (')[0])}"
        found[key] = found.get(key, 0.0) + 1
    for name, count in list(report.left_out.items())[:12]:
        found[f"live.left_out.{_slug(name)}"] = float(count)
    return {k: v for k, v in found.items() if math.isfinite(v)}


def _slug(text: str) -> str:
    return "_".join(text.replace(" KiB", "KiB").split())[:40]
