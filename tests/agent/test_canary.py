from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from agent.applier import Applier
from agent.bench.library import library
from agent.canary import run_canary
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.verdict import (
    Budget,
    MetricRule,
    compare,
    evaluate,
    run_sequential,
    schedule,
)
from agent.contract.wire import CanaryVerdict
from agent.host import HostPaths
from tests.agent.conftest import LoopFactory, enroll_lab_node
from tests.proc import BLKPILOT, ServiceProcess, clean_env

IOPS = MetricRule("iops", higher_is_better=True, tolerance=0.05)
P99 = MetricRule("lat_p99_us", higher_is_better=False, tolerance=0.10)


def noisy(center: float, spread: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


class TestStatistics:
    def test_same_distribution_tight_samples_pass(self) -> None:
        stats = compare(noisy(100, 0.01, 10, 1), noisy(100, 0.01, 10, 2), IOPS, 0.95)
        assert stats.verdict is CanaryVerdict.PASS
        assert stats.ci_low < 0 < stats.ci_high or abs(stats.relative_shift) < 0.01

    def test_a_real_regression_fails(self) -> None:
        stats = compare(noisy(100, 0.05, 8, 1), noisy(70, 0.05, 8, 2), IOPS, 0.95)
        assert stats.verdict is CanaryVerdict.FAIL
        assert stats.relative_shift == pytest.approx(-0.3, abs=0.06)
        assert stats.ci_high < 0
        assert stats.p_value < 0.01

    def test_direction_matters(self) -> None:
        # higher latency is worse; higher IOPS is better
        assert (
            compare(noisy(50, 0.02, 8, 1), noisy(80, 0.02, 8, 2), P99, 0.95).verdict
            is CanaryVerdict.FAIL
        )
        assert (
            compare(noisy(100, 0.02, 8, 1), noisy(130, 0.02, 8, 2), IOPS, 0.95).verdict
            is CanaryVerdict.PASS
        )

    def test_small_regressions_within_tolerance_do_not_fail(self) -> None:
        stats = compare(noisy(100, 0.005, 10, 1), noisy(97, 0.005, 10, 2), IOPS, 0.95)
        assert stats.verdict is CanaryVerdict.PASS  # 3 % worse, tolerance 5 %

    def test_noise_is_inconclusive(self) -> None:
        stats = compare(noisy(100, 0.4, 4, 1), noisy(100, 0.4, 4, 2), IOPS, 0.95)
        assert stats.verdict is CanaryVerdict.INCONCLUSIVE

    def test_overall_verdict_and_bonferroni(self) -> None:
        samples = {
            "A": {"iops": noisy(100, 0.01, 8, 1), "lat_p99_us": noisy(50, 0.01, 8, 3)},
            "B": {"iops": noisy(100, 0.01, 8, 2), "lat_p99_us": noisy(80, 0.01, 8, 4)},
        }
        verdict, per_metric = evaluate(samples, (IOPS, P99), alpha=0.05)
        assert verdict is CanaryVerdict.FAIL
        assert {s.metric: s.verdict for s in per_metric} == {
            "iops": CanaryVerdict.PASS,
            "lat_p99_us": CanaryVerdict.FAIL,
        }
        # a pass on each metric's own one-sided test (the interval at 1 - 2 alpha), a fail
        # Bonferroni-corrected over the two (1 - alpha / 2)
        assert all(s.confidence == pytest.approx(0.90) for s in per_metric)
        assert all(s.fail_confidence == pytest.approx(0.975) for s in per_metric)

    @staticmethod
    def simulate(
        rng: random.Random, budget: Budget, effect: float, bursty: bool, alpha: float = 0.05
    ) -> tuple[CanaryVerdict, int]:
        """One canary on a simulated device with the noise measured on a busy machine's loop
        device (±8 % per 0.5 s run). Bursty: a neighbour takes the CPU for a while (30 %
        slower, switching with probability 0.3 per run), so runs next to each other in the
        schedule (B B, A A) are slowed together. The candidate's IOPS are `effect` x the
        baseline's."""
        slowed = {"on": False}

        def sample() -> dict[str, float]:
            if bursty and rng.random() < 0.3:
                slowed["on"] = not slowed["on"]
            iops = 50_000 * (0.7 if slowed["on"] else 1.0) * (1 + rng.gauss(0, 0.08))
            iops *= effect if arm["now"] == "B" else 1.0
            return {"iops": iops, "lat_p99_us": 2e6 / iops * rng.uniform(0.9, 1.1)}

        arm = {"now": "A"}
        found = run_sequential(budget, lambda a: arm.update(now=a), sample, (IOPS, P99), alpha)
        return found.verdict, found.rounds

    @pytest.mark.parametrize("bursty", [False, True])
    def test_a_to_a_fails_no_more_often_than_alpha_however_many_looks(self, bursty: bool) -> None:
        """The false-fail rate the design promises over 2000 simulated A/A canaries, each
        looking up to three times (6, 12, 18 rounds): each look pays for itself."""
        rng = random.Random(7)
        alpha, runs = 0.05, 2000
        verdicts = [self.simulate(rng, Budget.of(6), 1.0, bursty, alpha)[0] for _ in range(runs)]
        fails = verdicts.count(CanaryVerdict.FAIL)
        assert fails / runs <= alpha / 2, fails  # a fail is one-sided: at most alpha / 2

    def test_a_candidate_worse_by_its_tolerance_on_one_metric_passes_no_more_than_alpha(
        self,
    ) -> None:
        """The other error the design bounds: a candidate whose p99 is exactly its tolerance
        (10 %) worse and whose IOPS are unchanged, 2000 simulated canaries of three looks
        each. A pass needs both metrics, so each is tested at alpha without a correction for
        the other (an intersection-union test: `levels`) — and the p99's test alone must keep
        such a candidate's passes within alpha, however many looks."""
        rng = random.Random(5)
        alpha, runs = 0.05, 2000
        passes = 0
        for _ in range(runs):
            arm = {"now": "A"}

            def sample(arm: dict[str, str] = arm) -> dict[str, float]:
                iops = 50_000 * (1 + rng.gauss(0, 0.08))
                p99 = 2e6 / 50_000 * (1 + rng.gauss(0, 0.08))
                return {"iops": iops, "lat_p99_us": p99 * (1.10 if arm["now"] == "B" else 1)}

            def use(now: str, arm: dict[str, str] = arm) -> None:
                arm["now"] = now

            found = run_sequential(Budget.of(6), use, sample, (IOPS, P99), alpha)
            passes += found.verdict is CanaryVerdict.PASS
        assert passes / runs <= alpha, passes

    @pytest.mark.parametrize("bursty", [False, True])
    def test_more_looks_turn_inconclusive_into_verdicts(self, bursty: bool) -> None:
        """A good change (+25 %) and a regression (-20 %), 300 canaries each, with one look
        after 6 rounds and with the sequential budget (6, 12, 18): the budget decides more of
        them, and a clear effect stops early instead of running the whole budget."""
        decided, rounds_run = {}, {}
        for name, budget in (("single", Budget.of(6, 6)), ("sequential", Budget.of(6))):
            rng = random.Random(11)
            for effect, wanted in ((1.25, CanaryVerdict.PASS), (0.8, CanaryVerdict.FAIL)):
                runs = [self.simulate(rng, budget, effect, bursty) for _ in range(300)]
                decided[name, effect] = sum(v is wanted for v, _ in runs)
                rounds_run[name, effect] = sum(r for _, r in runs) / len(runs)
        for effect in (1.25, 0.8):
            single, sequential = decided["single", effect], decided["sequential", effect]
            assert sequential >= min(300 * 0.97, 1.5 * single), (effect, single, sequential)
            assert rounds_run["sequential", effect] < 0.85 * 18, rounds_run
        if not bursty:  # where one look is usually enough, the budget is rarely touched
            assert max(rounds_run["sequential", e] for e in (1.25, 0.8)) < 9, rounds_run

    def test_the_budget_looks_and_stops(self) -> None:
        assert Budget.of(8).looks() == [8, 16, 24]
        assert Budget.of(8, 20, 5).looks() == [8, 13, 18, 20]
        assert Budget.of(5, 5).looks() == [5]
        with pytest.raises(ValueError, match="fewer than"):
            Budget.of(8, 6)
        with pytest.raises(ValueError, match="at least 3"):
            Budget.of(2)
        # samples that never decide: every look taken, every round run in the A B B A order
        arms: list[str] = []
        values = iter(range(1, 10_000))
        found = run_sequential(
            Budget.of(4, 10, 3),
            arms.append,
            lambda: {"iops": 100.0 + 40 * (next(values) % 3)},
            (IOPS,),
            0.05,
        )
        assert found.verdict is CanaryVerdict.INCONCLUSIVE
        assert (found.rounds, found.looks) == (10, 3)
        assert arms == schedule(10)
        assert len(found.samples["A"]["iops"]) == len(found.samples["B"]["iops"]) == 10

    def test_counterbalanced_schedule(self) -> None:
        order = schedule(4)
        assert order == ["A", "B", "B", "A", "A", "B", "B", "A"]


WORKLOAD = library()["hs23-single-randread-4k-qd1"]
# where bfq's cost stands out of a busy machine's noise on these loop devices: 4 KB reads at
# depth 32 (bench/results/fleet_gaps.md: bfq -39 % IOPS quiet, -45 % with a CPU hog; at depth
# 1 the gap was inside the rounds' spread, and a CI run came back inconclusive at -41 %)
DEEP = library()["hs23-single-randread-4k-qd32"]


def test_a_to_a_canary_does_not_fail(loop_device: LoopFactory, tmp_path: Path) -> None:
    """The same configuration against itself on a real device. At alpha 0.05 an A/A canary
    fails at most 2.5 % of the time by design (the simulation above holds the rate); one
    such run in CI is a flake, not a finding. At alpha 0.01 this test would fail in about one
    suite in 200 by chance, while a canary that favoured its baseline arm (a switch left
    half done, a warm-up charged to one arm) still fails it."""
    device = loop_device(on="tmpfs")
    applier = Applier(HostPaths(), tmp_path / "agent")
    result = run_canary(
        applier,
        device,
        WORKLOAD,
        DeviceConfig(scheduler=Scheduler.NONE),
        workdir=tmp_path,
        rounds=6,
        round_seconds=0.5,
        alpha=0.01,
    )
    assert result.verdict is not CanaryVerdict.FAIL, result.statistics()
    assert len(result.samples["A"]["iops"]) == len(result.samples["B"]["iops"]) == result.rounds
    assert result.rounds == 6 * result.looks
    assert "[none]" in Path(f"/sys/block/{device}/queue/scheduler").read_text()


def test_bfq_canary_fails_is_rolled_back_and_reported(
    service: ServiceProcess, loop_device: LoopFactory, tmp_path: Path
) -> None:
    device = loop_device(on="tmpfs")
    state_dir = tmp_path / "agent"
    enroll_lab_node(service, state_dir, [device])  # the service knows the device

    result = subprocess.run(
        [
            BLKPILOT,
            "agent",
            "canary",
            device,
            "--state-dir",
            str(state_dir),
            "--scheduler",
            "bfq",
            "--workload",
            DEEP.name,
            "--rounds",
            "8",
            "--round-seconds",
            "0.5",
        ],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr  # 1 = fail
    assert "verdict: fail" in result.stdout
    assert "baseline restored" in result.stdout
    # verified on the device itself, not only by the tool's word
    assert "[none]" in Path(f"/sys/block/{device}/queue/scheduler").read_text()
    assert "verdict and statistics sent to the service" in result.stdout

    (observation,) = service.api("GET", "/observations", params={"kind": "canary"}).json()
    assert observation["verdict"] == "fail"
    assert observation["configuration"]["scheduler"] == "bfq"
    stats = observation["statistics"]
    assert stats["iops.relative_shift"] < -0.05
    assert stats["iops.ci_high"] < 0
    assert stats["budget_rounds"] == 24  # three looks: after 8, 16 and 24 rounds
    assert stats["rounds"] == 8 * stats["looks"]
