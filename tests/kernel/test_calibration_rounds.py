"""The lab calibrates fios as the agent does, over rounds: a round whose costs do not grow
with size (a starved guest's spell) is set aside, the least of each point over the usable
rounds is taken, and with no usable round the calibration says it cannot."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agent import calibrate
from agent.contract.workloads import IOPattern
from agent.errors import BenchmarkFailed
from kernel.lab import scenarios


def _round(costs_us: dict[str, float], index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One round's fio results and stat readings: 1,000 requests a point, each costing
    costs_us (block layer time, which the calibration prefers)."""
    parsed, stat = {}, {}
    for tunable, cost_us in costs_us.items():
        label = f"r{index}/{tunable}"
        parsed[label] = SimpleNamespace(tasks=[SimpleNamespace(ios=1000, mean_latency_us=cost_us)])
        reads = calibrate.POINTS[tunable][0] is IOPattern.RANDREAD
        ticks = round(cost_us)  # 1,000 requests of cost_us µs: cost_us ms in all
        after = [1000, 0, 0, ticks, 0, 0, 0, 0] if reads else [0, 0, 0, 0, 1000, 0, 0, ticks]
        stat[label] = ("0 0 0 0 0 0 0 0", " ".join(str(v) for v in after))
    return parsed, stat


GOOD = {
    "cost_read_4k_ns": 250.0,
    "cost_read_128k_ns": 900.0,
    "cost_write_4k_ns": 4000.0,
    "cost_write_128k_ns": 4600.0,
}
# a starved spell: the 128 KiB write measured far cheaper than the 4 KiB one
BAD = {**GOOD, "cost_write_4k_ns": 9000.0, "cost_write_128k_ns": 4600.0}


def test_a_round_that_does_not_grow_with_size_is_set_aside() -> None:
    bad, bad_stat = _round(BAD, 0)
    good, good_stat = _round(GOOD, 1)
    costs = scenarios._calibrated({**bad, **good}, {**bad_stat, **good_stat}, "")
    assert costs == {k: round(v * 1000) for k, v in GOOD.items()}


def test_the_least_of_each_point_over_usable_rounds() -> None:
    slower = {k: v * 1.5 for k, v in GOOD.items()}
    first, first_stat = _round(slower, 0)
    second, second_stat = _round(GOOD, 1)
    costs = scenarios._calibrated({**first, **second}, {**first_stat, **second_stat}, "")
    assert costs == {k: round(v * 1000) for k, v in GOOD.items()}


def test_no_usable_round_is_a_calibration_refused() -> None:
    first, first_stat = _round(BAD, 0)
    second, second_stat = _round(BAD, 1)
    with pytest.raises(BenchmarkFailed, match="no calibration round was usable"):
        scenarios._calibrated({**first, **second}, {**first_stat, **second_stat}, "")


def test_a_device_not_calibrated_in_the_boot_has_no_costs() -> None:
    parsed, stat = _round(GOOD, 0)
    assert scenarios._calibrated(parsed, stat, "nullb0/") is None


def test_the_guest_runs_every_point_in_every_round() -> None:
    script, files = scenarios.calibration_files(1.0)
    for round_ in range(scenarios.CALIBRATION_ROUNDS):
        for tunable in calibrate.POINTS:
            assert f"BLKPILOT-RESULT-BEGIN r{round_}/{tunable}" in script
    assert len(files) == len(calibrate.POINTS)
