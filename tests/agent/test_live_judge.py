"""The live judge's parts on plain data (issue 65): the reference mix, closed and open loops
told apart by the run's own intervals, and a verdict that names the rule that decided
it. The canary on real traffic is tests/agent/test_live_canary.py and test_live_apps.py."""

from __future__ import annotations

import random

import pytest

from agent.contract.histograms import latency_slot
from agent.contract.verdict import MetricRule
from agent.contract.wire import CanaryVerdict, IoOperation
from agent.live_judge import (
    RATE_RULE,
    Interval,
    LiveSettings,
    decided_by,
    judge,
    loop_kind,
    reference_mix,
)

READ_16K = (IoOperation.READ, 14)
WRITE_16K = (IoOperation.WRITE, 14)


def _interval(latency_us: float, ios: int, seconds: float = 1.0) -> Interval:
    slot = latency_slot(latency_us * 1000)
    return Interval("A", {READ_16K: [(slot, ios)]}, ios, seconds)


def test_the_reference_mix_is_the_baselines_with_small_classes_left_out() -> None:
    a = Interval("A", {READ_16K: [(100, 900)], WRITE_16K: [(100, 95)],
                       (IoOperation.WRITE, 20): [(100, 5)]}, 1000, 1.0)  # fmt: skip
    weights = reference_mix([a, a], 0.02)
    assert set(weights) == {READ_16K, WRITE_16K}  # 0.5 % is below min_share
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights[READ_16K] == pytest.approx(900 / 995)


def test_a_closed_loop_is_told_from_an_open_one() -> None:
    """Little's law: N outstanding requests at latency L serve N / L a second (closed); paced
    clients are served at their own rate whatever L is (open). Too little spread in the
    baseline's latency: unknown, and the canary keeps the data-rate rule."""
    rng = random.Random(4)
    latencies = [rng.uniform(100, 400) for _ in range(20)]
    closed = [_interval(lat, int(4 / (lat / 1e6) * rng.uniform(0.95, 1.05))) for lat in latencies]
    kind, why = loop_kind(closed)
    assert kind == "closed", why
    opened = [_interval(lat, int(1500 * rng.uniform(0.9, 1.1))) for lat in latencies]
    kind, why = loop_kind(opened)
    assert kind == "open", why
    flat = [_interval(200 * rng.uniform(0.99, 1.01), 1500) for _ in range(20)]
    assert loop_kind(flat)[0] == "unknown"
    assert loop_kind(closed[:5])[0] == "unknown"


def test_the_verdict_names_the_rule_that_decided_it() -> None:
    rng = random.Random(5)
    n = 40
    base = [100 * rng.uniform(0.97, 1.03) for _ in range(n)]
    same = [100 * rng.uniform(0.97, 1.03) for _ in range(n)]
    slower = [1.6 * 100 * rng.uniform(0.97, 1.03) for _ in range(n)]
    rates = [1e6 * rng.uniform(0.97, 1.03) for _ in range(n)]
    rules = (MetricRule("lat_p99_us", False, 0.10), RATE_RULE)
    fail_only = frozenset({RATE_RULE.metric})

    def verdict(b_latency: list[float], b_rates: list[float]) -> tuple[CanaryVerdict, str]:
        samples = {
            "A": {"lat_p99_us": base, RATE_RULE.metric: rates},
            "B": {"lat_p99_us": b_latency, RATE_RULE.metric: b_rates},
        }
        found, stats = judge(samples, rules, 0.05, fail_only=fail_only)
        return found, decided_by(found, stats, fail_only)

    found, said = verdict(same, rates)
    assert found is CanaryVerdict.PASS
    assert said.startswith("decided by equivalence")
    found, said = verdict(slower, rates)
    assert found is CanaryVerdict.FAIL
    assert said.startswith("decided by latency: lat_p99_us +")
    found, said = verdict(same, [0.7 * r for r in rates])
    assert found is CanaryVerdict.FAIL
    assert said.startswith("decided by the data-rate rule: bytes_per_s -30")


def test_an_open_loop_is_judged_without_the_data_rate_rule() -> None:
    """For an open-loop application fewer bytes a second under a candidate is not harm (the
    clients set the pace; mq-deadline at async_depth 1 merged MariaDB's writes and was failed
    on its I/O rate though MariaDB's p99 improved 23 %)."""
    from dataclasses import replace

    settings = LiveSettings()
    assert RATE_RULE.metric in settings.fail_only()
    opened = replace(settings, rate_rule=None)
    assert opened.fail_only() == frozenset()
    assert RATE_RULE.metric not in {r.metric for r in opened.judged()}


def test_fewer_pairs_than_the_minimum_are_inconclusive_whatever_they_show() -> None:
    """The minimum evidence is the judge's rule: two pairs of a tenfold regression are no
    verdict, three are (the canary's looks and an audit of its evidence ask the same judge)."""
    from agent.live_judge import LIVE_RULES, MIN_PAIRS, judge

    def samples(pairs: int) -> dict[str, dict[str, list[float]]]:
        return {
            "A": {r.metric: [100.0 + i for i in range(pairs)] for r in LIVE_RULES},
            "B": {r.metric: [1000.0 + i for i in range(pairs)] for r in LIVE_RULES},
        }

    assert judge(samples(MIN_PAIRS - 1), LIVE_RULES, 0.05) == (CanaryVerdict.INCONCLUSIVE, [])
    verdict, stats = judge(samples(MIN_PAIRS + 5), LIVE_RULES, 0.05)
    assert verdict is CanaryVerdict.FAIL
    assert stats
