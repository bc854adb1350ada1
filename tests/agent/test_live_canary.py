"""The live canary on a device that holds data: a loop device with ext4 and files on it,
mounted, with fio reading a file in it as the "production" traffic. A/A passes; bfq idling
on four readers in turn fails and the baseline is restored; a change of the
traffic mix mid-canary makes no verdict of its own; the guard ends a bad candidate at once;
nothing but the workload reaches the device, and the filesystem checks clean afterwards."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.applier import Applier
from agent.canary_runs import live_for
from agent.collectors.blklat import BlkLatCollector, LatencySnapshot
from agent.collectors.diskstats import DiskstatsCollector
from agent.config import AgentConfig
from agent.contract.histograms import latency_slot
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.wire import CanaryVerdict, IoOperation
from agent.host import HostPaths
from agent.live_canary import (
    LiveCanaryUnavailable,
    LiveSettings,
    _LiveCanary,
    live_statistics,
    run_live_canary,
)
from agent.live_judge import Interval, pair_order, pair_values, reference_mix
from agent.signals import Interrupted, restoring_on_signals
from kernel.lab.devices import TMPFS, DataDevice, data_device, start_workload, stop_workload
from tests.conftest import LoopFactory
from tests.proc import BLKPILOT

# solo: an A/A canary beside the other test worker of make test failed twice in one run (its
# bursts are more than the CPU hog on one core the canary is held to): run alone
pytestmark = [pytest.mark.timeout(900), pytest.mark.solo]


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataDevice]:
    mount = tmp_path_factory.mktemp("live")
    backing = TMPFS / f"blkpilot-test-live-{uuid.uuid4().hex[:8]}.img"  # unique per worker
    with data_device(backing, 512 << 20, mount) as dev:
        yield dev
    assert dev.fsck == "", f"fsck -n found: {dev.fsck}"
    assert dev.files_intact


@pytest.fixture(scope="module")
def collector() -> Iterator[BlkLatCollector]:
    found = BlkLatCollector(HostPaths())
    assert found.available, found.unavailable
    yield found
    found.close()


@pytest.fixture
def applier(tmp_path: Path, device: DataDevice) -> Iterator[Applier]:
    found = Applier(HostPaths(), tmp_path / "state")
    yield found
    left = found.read(device.name, "scheduler")
    if left != "none":  # set back for the module's next test, which would otherwise start on it
        (Path("/sys/block") / device.name / "queue/scheduler").write_text("none")
    assert left == "none"


def writes(name: str) -> int:
    return DiskstatsCollector(HostPaths()).collect(0)[name].writes


SETTINGS = LiveSettings(seed=7)  # 40 pairs of 0.25 s intervals
GUARDED = LiveSettings(seed=7, guard_ratio=1.5)  # a tighter guard than the default 3x
# the full comparison alone, for readers that wait on their reads: a closed loop, said (told
# from the traffic it is closed most runs, but not every one: noted in issue 65's note)
UNGUARDED = LiveSettings(seed=7, guard_ratio=float("inf"), loop="closed")
# a candidate bad by construction, on any host: bfq idling up to 100 ms on each of four readers
# in turn (strictly, without its low-latency heuristics), where each reader pauses 500 µs
# after every read. With none the four pauses overlap; with it only one reader is served at a
# time, so their I/O rate falls to about a quarter whatever the host's speed. Measured with
# fio's own rate on 2026-11-30 (two 6 s runs each): 5,900-6,200 reads a second with none,
# 1,511 with it (-75 %), and their p99 from 0.55 to 52-58 ms.
# The readers run at distinct I/O priorities: four that start together at one priority are
# served by bfq as one queue (its stable merge), which nothing idles between. Without that, and
# without the pauses, the same candidate cost four readers 35 % of their rate on one host,
# 15-20 % on another (2026-11-30) and nothing on a third (a CI run failed on this test there:
# p50 31.7 against 31.5 µs); and bfq as the kernel sets it up moved one reader's p50 +3.7 %.
BAD_BFQ = DeviceConfig(
    scheduler=Scheduler.BFQ,
    scheduler_tunables={"slice_idle_us": 100_000, "low_latency": 0, "strict_guarantees": 1},
)


def four_readers(device: DataDevice) -> subprocess.Popen[str]:
    """BAD_BFQ's traffic: four 4 KiB random readers, one I/O each at a time with a 500 µs pause
    after each, at four best-effort priorities."""
    return start_workload(
        device.data_file,
        iodepth=1,
        engine="psync",
        jobs=4,
        thinktime_us=500,
        distinct_priorities=True,
        device=device.name,
    )


def test_a_a_does_not_fail_and_writes_nothing(
    device: DataDevice, collector: BlkLatCollector, applier: Applier
) -> None:
    workload = start_workload(
        device.data_file, rw="randread", iodepth=1, engine="psync", device=device.name
    )
    try:
        written = writes(device.name)
        result, report, traffic = run_live_canary(
            applier, device.name, DeviceConfig(scheduler=Scheduler.NONE), collector, SETTINGS
        )
        assert writes(device.name) == written  # a read workload, and the canary wrote nothing
    finally:
        stop_workload(workload)
    # On a quiet machine it passes (bench/results/live_canary.md: 11 of 12 A/A). With both
    # cores busy (the suite beside other work) the intervals widen past the tolerances and it
    # can come back inconclusive; what it must never do is fail, or show a shift
    assert result.verdict is not CanaryVerdict.FAIL, (result.per_metric, report)
    if result.verdict is CanaryVerdict.INCONCLUSIVE:
        for stats in result.per_metric:
            assert abs(stats.relative_shift) < 0.10, (stats, report)
    assert report.pairs_used >= SETTINGS.pairs
    assert report.ios["A"] > 1000
    assert report.ios["B"] > 1000
    assert traffic.tool == "live"
    assert traffic.jobs[0].read_share == 1.0
    assert traffic.jobs[0].block_sizes == {4096: 100}


def test_bfq_fails_and_the_baseline_is_restored(
    device: DataDevice, collector: BlkLatCollector, applier: Applier
) -> None:
    """The full comparison on its own (the guard out of reach) fails a candidate that costs the
    traffic three quarters of its I/O rate, on the rate and on the tail, and puts the
    baseline back. (On 2026-11-30: the I/O rate -71 %, p99 +7,000-8,700 %, in 32-34 s.)"""
    workload = four_readers(device)
    try:
        result, report, _ = run_live_canary(applier, device.name, BAD_BFQ, collector, UNGUARDED)
    finally:
        stop_workload(workload)
    assert result.verdict is CanaryVerdict.FAIL, (result.per_metric, report)
    assert not report.guard_tripped
    shifts = {stats.metric: stats.relative_shift for stats in result.per_metric}
    assert report.loop == "closed", report.loop_why  # as set
    assert shifts["bytes_per_s"] < -0.10, shifts  # past the rate's tolerance, the way it costs
    # every request the device completed while the canary measured is in some interval or in
    # a switch's settling: the ones bfq held back complete as the switch away from it drains
    # the queue, and were lost between two intervals (on 2026-12-02 the intervals counted 63 %
    # of the device's completions, the candidate's arm losing most; since each interval ends
    # on its switch, 0.0 % uncounted in two runs, one with a CPU hog: 87-88 % in intervals,
    # 12 % in settling)
    uncounted = live_statistics(report)["live.uncounted_share"]
    assert uncounted < 0.05, (uncounted, report.completed, report.ios)
    # (its block p99 read +7,000 % on 2026-11-30 and -29 % in a run of 2026-12-02 under the
    # fixed-mix judge: bfq serves one reader at a time, and what completes is fast — the rate
    # is what the application loses, and what fails it; issue 65's note)
    assert not result.kept_candidate
    assert applier.read(device.name, "scheduler") == "none"


def test_the_guard_ends_a_bad_candidate_at_once(
    device: DataDevice, collector: BlkLatCollector, applier: Applier
) -> None:
    """bfq idling 100 ms on each of four paced readers in turn, under a guard at 1.5x the
    baseline's p99 (the ratio is the operator's setting): the guard ends it early, and says
    so at the ratio set. Its readers wait for one another's turns, tens of milliseconds, where
    none's p99 is below one (on 2026-11-30: 41-90 ms over 420-470 I/Os, ended in 4 s, with the
    default 3x guard as with 1.5x)."""
    workload = four_readers(device)
    try:
        result, report, _ = run_live_canary(applier, device.name, BAD_BFQ, collector, GUARDED)
    finally:
        stop_workload(workload)
    assert result.verdict is CanaryVerdict.FAIL
    assert applier.read(device.name, "scheduler") == "none"
    assert report.guard_tripped.startswith("guard: the candidate's p99 reached"), report
    assert "1.5x the baseline's" in report.guard_tripped, report.guard_tripped
    # ended early: before the full comparison's first look (its intervals now as long as the
    # traffic's rate asks, so "early" is counted in pairs, not in a fixed number of seconds)
    assert result.looks == 0, result
    assert report.pairs_used < SETTINGS.pairs, report


def test_a_mix_change_mid_canary_makes_no_verdict_of_its_own(
    device: DataDevice, collector: BlkLatCollector, applier: Applier
) -> None:
    """A/A while the traffic changes from 4 KiB to 64 KiB reads half-way: not a fail; the
    canary saw both mixes and set aside the pair the change fell in, or re-weighted it."""
    first = start_workload(device.data_file, rw="randread", iodepth=4, device=device.name)
    running = {"now": first}

    def change() -> None:
        stop_workload(first)
        running["now"] = start_workload(
            device.data_file, rw="randread", block_size="64k", device=device.name
        )

    timer = threading.Timer(SETTINGS.pairs * SETTINGS.interval_s * 1.2, change)
    timer.start()
    try:
        result, report, _ = run_live_canary(
            applier, device.name, DeviceConfig(scheduler=Scheduler.NONE), collector, SETTINGS
        )
    finally:
        timer.cancel()
        timer.join()
        stop_workload(running["now"])
        stop_workload(first)
    assert result.verdict is not CanaryVerdict.FAIL, (result.per_metric, report)
    assert {"read/4096", "read/65536"} <= set(report.mix), report.mix


def test_no_traffic_no_canary(
    device: DataDevice, collector: BlkLatCollector, applier: Applier
) -> None:
    """No traffic: intervals grow to their longest, and the canary says it cannot judge."""
    with pytest.raises(LiveCanaryUnavailable, match="too little traffic to judge"):
        run_live_canary(
            applier,
            device.name,
            DeviceConfig(scheduler=Scheduler.BFQ),
            collector,
            LiveSettings(interval_s=0.25, max_interval_s=1.0),
        )


def test_thin_traffic_gets_longer_intervals_and_a_verdict(
    device: DataDevice, collector: BlkLatCollector, applier: Applier
) -> None:
    """100 reads a second (a quiet database): refused 6 of 6 times at a fixed 0.25 s first
    interval. Intervals now grow until they hold min_ios I/Os: about 2.5 s here."""
    workload = start_workload(
        device.data_file, rw="randread", iodepth=1, engine="psync", device=device.name,
        rate_iops=100,
    )  # fmt: skip
    try:
        result, report, _ = run_live_canary(
            applier,
            device.name,
            DeviceConfig(scheduler=Scheduler.NONE),
            collector,
            LiveSettings(seed=5, pairs=4, max_pairs=4),
        )
    finally:
        stop_workload(workload)
    assert report.pairs_used + report.pairs_set_aside >= 4
    assert min(report.ios.values()) >= 4 * 200
    used = report.traffic_seconds / (2 * (report.pairs_used + report.pairs_set_aside) + 1)
    assert used > 1.0  # intervals grew past the shortest (0.25 s) to hold 200 I/Os
    assert report.pairs_used >= 3  # judged, not refused (an A/A's rate of false fails is
    assert result.per_metric  # bench.live_canary's business, over many runs)


def test_a_canary_that_cannot_run_exits_4(device: DataDevice, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            BLKPILOT, "agent", "canary", device.name, "--mode", "live", "--scheduler", "bfq",
            "--max-interval", "0.5", "--no-report", "--state-dir", str(tmp_path / "agent"),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    assert "could not run" in done.stderr
    assert "too little traffic" in done.stderr
    assert "[none]" in Path(f"/sys/block/{device.name}/queue/scheduler").read_text()


# --- the judge on plain data ------------------------------------------------------------------


def hist(center_ns: int, n: int) -> list[tuple[int, int]]:
    return [
        (latency_slot(center_ns * 0.9), n // 4),
        (latency_slot(center_ns), n // 2),
        (latency_slot(center_ns * 1.1), n // 4),
    ]


def interval(arm: str, small: int, large: int) -> Interval:
    """Small 4 KiB reads at 20 us and large 64 KiB reads at 200 us, in some proportion."""
    strata = {}
    if small:
        strata[(IoOperation.READ, 12)] = hist(20_000, small)
    if large:
        strata[(IoOperation.READ, 16)] = hist(200_000, large)
    return Interval(arm, strata, small + large, 1.0)


def test_a_pair_is_compared_under_one_mix() -> None:
    """The same latencies per class, a different mix: read under the reference mix, no
    difference — where the plain percentiles would show a large one."""
    a, b = interval("A", 8000, 2000), interval("B", 7000, 3000)
    assert b.quantile_us(0.75) > 1.5 * a.quantile_us(0.75)  # unweighted: looks like an effect
    values, why, left_out = pair_values(a, b, reference_mix([a], 0.02), LiveSettings())
    assert (why, left_out) == ("", [])
    assert values is not None
    assert values["A"] == pytest.approx(values["B"], rel=1e-9)


def test_a_mix_shift_is_compared_not_set_aside() -> None:
    """Issue 65: a pair whose mix moved by a total variation of 0.7 (MariaDB's own moved
    0.46-0.59 between intervals) was set aside; it is now compared under the reference mix,
    and a class one half lacks is left out of both halves. Only too little traffic, a
    tenfold load or nothing in common set a pair aside."""
    weights = reference_mix([interval("A", 9000, 1000)], 0.02)
    values, why, _ = pair_values(interval("A", 9000, 1000), interval("B", 2000, 8000), weights,
                                 LiveSettings())  # fmt: skip
    assert values is not None, why
    assert values["A"]["lat_p50_us"] == pytest.approx(values["B"]["lat_p50_us"], rel=1e-9)
    values, why, left_out = pair_values(
        interval("A", 9000, 1000), interval("B", 10000, 0), weights, LiveSettings()
    )
    assert values is not None
    assert left_out == [(IoOperation.READ, 16)]
    # three times the load: kept, and adjusted for by the judge; fifteen times: set aside
    values, why, _ = pair_values(
        interval("A", 8000, 2000), interval("B", 24000, 6000), weights, LiveSettings()
    )
    assert values is not None
    values, why, _ = pair_values(
        interval("A", 8000, 2000), interval("B", 120000, 30000), weights, LiveSettings()
    )
    assert values is None
    assert why.startswith("load shifted")
    values, why, _ = pair_values(interval("A", 100, 0), interval("B", 100, 0), weights,
                                 LiveSettings())  # fmt: skip
    assert values is None
    assert why.startswith("too little traffic")


def test_pairs_are_balanced_and_shuffled() -> None:
    import random

    orders = pair_order(12, random.Random(1))
    assert orders.count(("A", "B")) == orders.count(("B", "A")) == 6
    assert orders != pair_order(12, random.Random(2))


def test_auto_picks_the_live_canary_where_the_device_holds_data(
    device: DataDevice, loop_device: LoopFactory
) -> None:
    """What staged rollouts and scheduled canaries run (`--mode auto`): live on the device with
    a filesystem, synthetic on an empty scratch device."""
    config = AgentConfig()
    assert live_for(config, device.name, "auto")
    scratch = loop_device(on="tmpfs")
    assert not live_for(config, scratch, "auto")
    assert live_for(config, scratch, "live")
    assert not live_for(config, device.name, "synthetic")


class ScriptedTraffic:
    """A collector whose traffic is scripted, for the guard's logic on a real device: each
    collection adds 400 reads of 4 KiB at 20 µs — at `candidate_us` where the device ran the
    candidate's scheduler (read back from sysfs, as the applier left it) — and the n-th
    collection under the candidate (`stall_at`) adds 60 reads of 5 ms: one stall; or the n-th
    under the baseline (`baseline_stall_at`). The reads a collection adds were served since the
    one before, under the scheduler the device had then: the first collection after a switch
    counts what the switch drained, issued under the scheduler left."""

    available = True
    unavailable = ""

    def __init__(
        self,
        device: str,
        candidate: str,
        candidate_us: float,
        stall_at: int,
        baseline_stall_at: int = 0,
    ) -> None:
        self.device, self.candidate = device, candidate
        self.candidate_us, self.stall_at = candidate_us, stall_at
        self.baseline_stall_at = baseline_stall_at
        self.counts: dict[int, int] = {}
        self.under_candidate = 0
        self.under_baseline = 0
        self.served_by: bool | None = None  # the candidate's scheduler at the last collection

    def collect(self, now: float) -> LatencySnapshot:
        scheduler = Path(f"/sys/block/{self.device}/queue/scheduler").read_text()
        now_on_candidate = f"[{self.candidate}]" in scheduler
        on_candidate = now_on_candidate if self.served_by is None else self.served_by
        self.served_by = now_on_candidate
        latency_us = self.candidate_us if on_candidate else 20.0
        self._add(latency_us, 400)
        if on_candidate:
            self.under_candidate += 1
            if self.under_candidate == self.stall_at:
                self._add(5000.0, 60)
        else:
            self.under_baseline += 1
            if self.under_baseline == self.baseline_stall_at:
                self._add(5000.0, 60)
        key = (self.device, IoOperation.READ, "total_ns", 12)
        return LatencySnapshot({key: dict(self.counts)})

    def _add(self, latency_us: float, count: int) -> None:
        slot = latency_slot(latency_us * 1000)
        self.counts[slot] = self.counts.get(slot, 0) + count


@pytest.mark.parametrize(
    ("candidate_us", "stall_at", "baseline_stall_at", "tripped"),
    [(20.0, 8, 0, False), (400.0, 8, 0, True), (100.0, 0, 3, True)],
    ids=["a-a-with-a-stall", "bad", "bad-after-a-baseline-stall"],
)
def test_one_stall_does_not_trip_the_guard_a_bad_candidate_does(
    loop_device: LoopFactory,
    tmp_path: Path,
    candidate_us: float,
    stall_at: int,
    baseline_stall_at: int,
    tripped: bool,
) -> None:
    """The guard's pooled p99 passes its limit when one stall lands in a candidate interval;
    the candidate's next interval, clean, clears it. A candidate 20x slower trips it. One stall
    in a baseline interval (its p99 5 ms, 250x the others') does not set the limit: a
    candidate 5x slower still trips it (with the largest baseline p99 as the tail it ran to
    the end: bfq on this host's live device did, 2026-11-28)."""
    name = loop_device(size_mb=16)
    applier = Applier(HostPaths(), tmp_path / "state")
    traffic = ScriptedTraffic(
        name, "mq-deadline", candidate_us, stall_at=stall_at, baseline_stall_at=baseline_stall_at
    )
    settings = LiveSettings(seed=3, pairs=10, max_pairs=10, interval_s=0.01, load_ratio=1e9)
    result, report, _ = run_live_canary(
        applier,
        name,
        DeviceConfig(scheduler=Scheduler.MQ_DEADLINE),
        traffic,  # type: ignore[arg-type]
        settings,
    )
    # the stall happened, under the arm it was meant for
    assert traffic.under_candidate > stall_at
    assert traffic.under_baseline > baseline_stall_at
    assert bool(report.guard_tripped) is tripped, report.guard_tripped
    if tripped:
        assert result.verdict is CanaryVerdict.FAIL
        assert "again in its next interval" in report.guard_tripped
    else:
        assert result.verdict is not CanaryVerdict.FAIL
        assert report.pairs_used == settings.pairs
    assert applier.read(name, "scheduler") == ("mq-deadline" if result.kept_candidate else "none")


def test_both_arms_read_the_map_as_often(loop_device: LoopFactory, tmp_path: Path) -> None:
    """Each read of the eBPF map takes CPU from the application: a candidate arm that read it
    four times an interval (for the guard) and a baseline that read it once made a CPU-bound
    db_bench slower under an unchanged configuration, and its A/A failed 6 of 6."""
    name = loop_device(size_mb=16)
    applier = Applier(HostPaths(), tmp_path / "state")
    traffic = ScriptedTraffic(name, "mq-deadline", 20.0, stall_at=10**6)
    settings = LiveSettings(seed=3, interval_s=0.01, guard_checks=4)
    canary = _LiveCanary(
        applier,
        name,
        DeviceConfig(scheduler=Scheduler.NONE),
        traffic,  # type: ignore[arg-type]
        settings,
        time.sleep,
    )
    reads = []
    for arm in ("A", "B", "A", "B"):
        before = sum(traffic.counts.values())
        canary.measure(arm)
        reads.append((sum(traffic.counts.values()) - before) // 400)
    assert reads == [settings.guard_checks + 1] * 4


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: signal.Signals(s).name
)
def test_a_signal_mid_canary_restores_the_baseline(
    device: DataDevice, collector: BlkLatCollector, applier: Applier, signum: int
) -> None:
    """Stopped while the candidate's interval runs (`systemctl stop`, Ctrl-C, a closed
    terminal): SIGTERM and SIGHUP ended the process with bfq still set."""
    scheduler = Path(f"/sys/block/{device.name}/queue/scheduler")

    def sleep(seconds: float) -> None:
        time.sleep(seconds)
        if "[bfq]" in scheduler.read_text():
            os.kill(os.getpid(), signum)

    workload = start_workload(
        device.data_file, rw="randread", iodepth=1, engine="psync", device=device.name
    )
    try:
        with pytest.raises(Interrupted) as stopped, restoring_on_signals():
            run_live_canary(
                applier,
                device.name,
                DeviceConfig(scheduler=Scheduler.BFQ),
                collector,
                SETTINGS,
                sleep=sleep,
            )
    finally:
        stop_workload(workload)
    assert stopped.value.signum == signum
    assert "[none]" in scheduler.read_text()
    assert not (applier.state_dir / "journal.json").exists()


def test_sigterm_to_the_command_restores_and_exits_143(device: DataDevice, tmp_path: Path) -> None:
    """`blkpilot agent canary --mode live`, stopped with SIGTERM while the candidate is set:
    the baseline is back before it exits, with the shell's status for SIGTERM."""
    scheduler = Path(f"/sys/block/{device.name}/queue/scheduler")
    workload = start_workload(
        device.data_file, rw="randread", iodepth=1, engine="psync", device=device.name
    )
    try:
        canary = subprocess.Popen(
            [
                BLKPILOT,
                "agent",
                "canary",
                device.name,
                "--mode",
                "live",
                "--scheduler",
                "bfq",
                "--no-report",
                "--state-dir",
                str(tmp_path / "agent"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while "[bfq]" not in scheduler.read_text() and canary.poll() is None:
                assert time.monotonic() < deadline, "the candidate was never applied"
                time.sleep(0.01)
            canary.send_signal(signal.SIGTERM)
            out, err = canary.communicate(timeout=60)
        finally:
            if canary.poll() is None:
                canary.kill()
    finally:
        stop_workload(workload)
    assert canary.returncode == 143, out + err
    assert "stopped by SIGTERM" in err
    assert "[none]" in scheduler.read_text()


def test_load_is_a_covariate_fitted_on_the_baseline() -> None:
    """Latency that rises with load: a pair whose candidate half saw twice the baseline's load
    reads slower by the baseline's own slope, and is adjusted back; a candidate that slowed
    a closed-loop application down (fewer I/Os, each slower) is never made to look faster."""
    from agent.live_judge import LIVE_RULES, judge, load_slope

    rng = random.Random(1)
    rates = [rng.uniform(500, 5000) for _ in range(20)]
    latency = [100 * (r / 1000) ** 0.5 * rng.uniform(0.97, 1.03) for r in rates]
    assert load_slope(latency, rates) == pytest.approx(0.5, abs=0.1)
    assert load_slope(latency[:5], rates[:5]) == 0.0  # too few pairs to fit
    assert load_slope([100.0] * 20, [1000.0 * (1 + 0.01 * i) for i in range(20)]) == 0.0

    # an A/A whose B halves all saw 2x the load: unadjusted it reads +41 % (and fails)
    b_rates = [2 * r for r in rates]
    b_latency = [100 * (r / 1000) ** 0.5 * rng.uniform(0.97, 1.03) for r in b_rates]
    samples = {"A": {"lat_p50_us": latency}, "B": {"lat_p50_us": b_latency}}
    rules = LIVE_RULES[:1]
    raw, _ = judge(samples, rules, 0.05)
    adjusted, stats = judge(samples, rules, 0.05, load={"A": rates, "B": b_rates})
    assert raw is CanaryVerdict.FAIL
    assert adjusted is not CanaryVerdict.FAIL
    assert abs(stats[0].relative_shift) < 0.05

    # a real regression that also halves the rate it is asked for: still a fail
    slow_rates = [r / 2 for r in rates]
    slow = [1.5 * 100 * (r / 1000) ** 0.5 for r in slow_rates]
    samples = {"A": {"lat_p50_us": latency}, "B": {"lat_p50_us": slow}}
    verdict, stats = judge(samples, rules, 0.05, load={"A": rates, "B": slow_rates})
    assert verdict is CanaryVerdict.FAIL
    assert stats[0].relative_shift > 0.4


def test_long_intervals_look_first_after_a_bounded_time() -> None:
    """A quiet database judged on its SLI (2 s intervals): 40 pairs before the first look were
    160 s, and two looks 6 minutes (330 s for pgbench's inconclusive depth-limit candidate in
    bench.live_apps). The first look now comes after about 80 s of traffic, and then one every
    as much, as many as the time budget holds (issue 65: a budget in time, not in pairs)."""
    from agent.live_canary import budget_for

    settings = LiveSettings()
    dense = budget_for(settings, 0.25)
    assert (dense.rounds, dense.max_rounds) == (40, 240)
    slow = budget_for(settings, 2.0)
    assert (slow.rounds, slow.max_rounds) == (20, 120)
    assert len(slow.looks()) == settings.max_seconds // settings.first_look_s == 6
    assert slow.max_rounds * 2 * 2.0 <= settings.max_seconds  # every look within the budget
    short = budget_for(LiveSettings(max_seconds=120), 2.0)
    assert (short.rounds, short.max_rounds) == (20, 60)
    thin = budget_for(LiveSettings(), 10.0)
    assert thin.rounds == 12  # never fewer than min_pairs
    assert budget_for(LiveSettings(pairs=4, max_pairs=4), 10.0).rounds == 4  # as asked


def test_the_io_rate_can_fail_a_candidate_but_not_pass_one() -> None:
    """A closed-loop application slowed by the candidate issues fewer I/Os while block latency
    reads the same (bfq on CPU-bound db_bench passed on block latency alone in CI): a rate that
    falls in pair after pair fails it. A rate that only wanders — the demand's own noise —
    neither fails the candidate nor keeps an unchanged one from passing."""
    from agent.live_judge import judge

    settings = LiveSettings()
    rng = random.Random(3)
    n = 40
    latency = [[100 * rng.uniform(0.98, 1.02) for _ in range(n)] for _ in range(4)]
    base_rates = [rng.uniform(30_000, 70_000) for _ in range(n)]

    def samples(b_rates: list[float]) -> dict[str, dict[str, list[float]]]:
        return {
            "A": {"lat_p50_us": latency[0], "lat_p99_us": latency[1], "bytes_per_s": base_rates},
            "B": {"lat_p50_us": latency[2], "lat_p99_us": latency[3], "bytes_per_s": b_rates},
        }

    rules, fail_only = settings.judged(), settings.fail_only()
    assert fail_only == {"bytes_per_s"}
    assert "bytes_per_s" in {r.metric for r in rules}
    slower = [0.7 * r * rng.uniform(0.95, 1.05) for r in base_rates]
    verdict, stats = judge(samples(slower), rules, 0.05, fail_only=fail_only)
    assert verdict is CanaryVerdict.FAIL
    assert {s.metric: s.verdict for s in stats}["lat_p50_us"] is CanaryVerdict.PASS
    # the same latencies with the rate left to chance: pass, though the rate's interval is wide
    wandering = [r * rng.uniform(0.5, 1.5) for r in base_rates]
    verdict, stats = judge(samples(wandering), rules, 0.05, fail_only=fail_only)
    assert {s.metric: s.verdict for s in stats}["bytes_per_s"] is not CanaryVerdict.PASS
    assert verdict is CanaryVerdict.PASS
    # without the rule, the slower candidate would pass: the rule is what catches it
    assert judge(samples(slower), LiveSettings(rate_rule=None).judged(), 0.05)[0] is (
        CanaryVerdict.PASS
    )
