"""bench.lab_fios_efficiency's arithmetic, on results shaped as the lab's parser returns them:
rounds paired by label, fios' efficiency over mq-deadline's in the same round, and the cases
where fios is below in most rounds. (The lab boot itself is tests/kernel/test_lab.py's.)"""

from __future__ import annotations

import pytest

from agent.bench.fio import FioResult, TaskResult
from bench.lab_fios_efficiency import at_equal_user_cpu, judged, pooled
from kernel.lab.qemu import TUNABLE_NOT_SET, Boot
from kernel.lab.scenarios import (
    EFFICIENCY_DEVICES,
    SCENARIOS,
    efficiency_cases,
    efficiency_script,
    fios_settings,
    fios_tunable_names,
    guest_cpu_per_io,
    round_label,
    summarize_efficiency,
)


def _task(job: str, index: int, iops: float, latency_us: float) -> TaskResult:
    return TaskResult(
        job, index, int(iops), int(iops) * 4096, iops, latency_us, latency_us, latency_us
    )


def _runs(case: str, scheduler: str, reader_iops: float) -> dict[str, FioResult]:
    """A reader and a writer, each 1,000 IOPS alone; together the writer keeps 500 IOPS and
    the reader `reader_iops` (efficiency 0.5 + reader_iops / 1000)."""
    together = [_task("reader", 0, reader_iops, 1e6 / reader_iops), _task("writer", 0, 500, 2000)]
    return {
        f"{case}/{scheduler}/together": FioResult(together, {}),
        f"{case}/{scheduler}/alone-reader": FioResult([_task("reader", 0, 1000, 1000)], {}),
        f"{case}/{scheduler}/alone-writer": FioResult([_task("writer", 0, 1000, 1000)], {}),
    }


def test_rounds_are_paired_and_a_case_below_in_most_rounds_is_named() -> None:
    parsed: dict[str, FioResult] = {}
    # fios-a: fios below mq-deadline in two rounds of three; fios-b@nullb0: above in all
    for index, (fios_a, mq_a) in enumerate([(400, 500), (600, 500), (450, 500)]):
        parsed |= _runs("fios-a", round_label("fios", index), fios_a)
        parsed |= _runs("fios-a", round_label("mq-deadline", index), mq_a)
        parsed |= _runs("fios-b@nullb0", round_label("fios", index), 700)
        parsed |= _runs("fios-b@nullb0", round_label("mq-deadline", index), 500)
    # a round with one scheduler only (a boot cut short) is left out of the pairs
    parsed |= _runs("fios-a", round_label("fios", 3), 900)
    stats = {
        "fios-a/fios+r0/together": {"epochs": "61", "anticipations": "3", "anticipation_hits": "2"}
    }

    cases = summarize_efficiency(parsed, stats)["cases"]

    a = cases["a"]
    assert a["rounds"] == 3
    assert a["efficiency"]["fios"] == [0.9, 1.1, 0.95]
    assert a["efficiency"]["mq-deadline"] == [1.0, 1.0, 1.0]
    assert a["ratios"] == [0.9, 1.1, 0.95]
    assert a["fios_at_least_as_busy"] == 1
    assert a["fios_epochs"] == [61, None, None]
    # whose share moved: each task's slowdown, round by round (fios' reader at 400 of 1,000)
    first = a["slowdowns"]["fios"][0]
    assert first["reader_0"] == pytest.approx(2.5, rel=0.01)
    assert first["writer_0"] == pytest.approx(2.0, rel=0.01)
    assert len(a["slowdowns"]["mq-deadline"]) == 3
    assert 0.97 < a["ratio_geomean"] < 0.99
    b = cases["b@nullb0"]
    assert b["ratios"] == [1.2, 1.2, 1.2]
    assert b["fios_at_least_as_busy"] == 3

    verdict = judged(cases)
    assert verdict["below"] == "a"
    assert verdict["lowest"] == a["ratio_geomean"]
    assert verdict["fios_epochs_min"] == 61
    assert "a: 0.98 [0.9-1.1] (1/3)" in verdict["table"]


def test_the_scenario_alternates_the_schedulers_round_by_round_on_both_devices() -> None:
    script, files = SCENARIOS["efficiency-smp2"].script(3, 1.0, {})
    begun = [line.split()[2] for line in script.splitlines() if "RESULT-BEGIN" in line]
    together = [label for label in begun if label.endswith("/together")]
    flash = [label.split("/")[1] for label in together if "@" not in label.split("/")[0]]
    # schedulers in blocks of five cases: mq-deadline first in even rounds, fios in odd
    blocks = list(dict.fromkeys(flash))
    assert blocks == [
        "mq-deadline+r0",
        "fios+r0",
        "fios+r1",
        "mq-deadline+r1",
        "mq-deadline+r2",
        "fios+r2",
    ]
    assert len(together) == 2 * 5 * 2 * 3  # two devices, five cases, two schedulers, 3 rounds
    assert any(label.startswith("fios-1r7w@nullb0/") for label in together)
    assert "submit_queues=2" in script
    assert len(files) == len(begun)
    # the guest's CPU is read around every run of the tasks together, and only those
    cpu = [line.split()[2] for line in script.splitlines() if line.endswith("/cpu")]
    assert cpu == [f"{label}/cpu" for label in together]


def _stat(user: int, system: int, idle: int, softirq: int) -> str:
    return f"cpu  {user} 0 {system} {idle} 0 0 {softirq} 0 0 0"


def test_the_guest_cpu_of_a_run_is_split_per_io() -> None:
    counters = {
        "before": _stat(1000, 2000, 5000, 100),
        "after": _stat(1100, 2300, 5100, 200),  # 500 ticks busy, 100 idle: 5 s of 6
        "before_ctxt": "ctxt 10000",
        "after_ctxt": "ctxt 30000",
    }
    split = guest_cpu_per_io(counters, ios=10_000)
    assert split["busy_share"] == round(500 / 600, 3)
    assert split["busy_us_per_io"] == 500.0  # 5 s over 10,000 I/Os
    assert split["user_us_per_io"] == 100.0
    assert split["system_us_per_io"] == 300.0
    assert split["irq_us_per_io"] == 100.0
    assert split["context_switches_per_io"] == 2.0
    # nothing to split: no counters, or a run that completed nothing
    assert guest_cpu_per_io({}, ios=10_000) == {}
    assert guest_cpu_per_io(counters, ios=0) == {}


def test_fios_cpu_a_request_is_paired_with_mq_deadlines_round_by_round() -> None:
    parsed: dict[str, FioResult] = {}
    stats: dict[str, dict[str, str]] = {}
    for scheduler, busy in (("fios", 660), ("mq-deadline", 600)):
        label = f"fios-a@nullb0/{round_label(scheduler, 0)}/together"
        parsed |= _runs("fios-a@nullb0", round_label(scheduler, 0), 500)
        parsed[label] = FioResult(parsed[label].tasks, {"ios": 6000.0})
        stats[f"{label}/cpu"] = {
            "before": _stat(0, 0, 0, 0),
            "after": _stat(0, busy, 700 - busy, 0),
        }
    stats[f"fios-a@nullb0/{round_label('fios', 0)}/together"] = {"kicks": "3000", "lent": "60"}
    case = summarize_efficiency(parsed, stats)["cases"]["a@nullb0"]
    assert case["fios_per_io"] == [{"kicks": 0.5, "lent": 0.01}]
    assert case["guest_cpu"]["fios"][0]["busy_us_per_io"] == 1100.0
    assert case["guest_cpu"]["mq-deadline"][0]["busy_us_per_io"] == 1000.0
    assert case["busy_us_per_io_ratios"] == [1.1]


def test_a_subset_of_cases_runs_only_its_workloads_on_its_devices() -> None:
    workloads, devices = efficiency_cases(["1r7w", "deep-writers@nullb0"])
    assert workloads == ("fios-1r7w", "fios-deep-writers")
    assert devices == ("flashsim0", "nullb0")
    script, _ = efficiency_script(2, *efficiency_cases(["1r7w@nullb0"]))(1, 1.0, {})
    together = [
        line.split()[2]
        for line in script.splitlines()
        if "RESULT-BEGIN" in line and line.endswith("/together")
    ]
    assert sorted(together) == [
        "fios-1r7w@nullb0/fios+r0/together",
        "fios-1r7w@nullb0/mq-deadline+r0/together",
    ]
    # null_blk alone still loads fios before selecting it
    assert script.index("insmod /lib/modules/fios.ko") < script.index("echo fios >")
    with pytest.raises(ValueError, match="no such case: 9r9w, 1r7w@sda"):
        efficiency_cases(["9r9w", "1r7w", "1r7w@sda"])
    with pytest.raises(ValueError, match="none given"):
        efficiency_cases([])


def test_a_variant_is_written_over_fios_tunables_on_both_devices_and_only_fios() -> None:
    settings = fios_settings(["alpha_permille=0", "write_depth=2"])
    assert settings == {"alpha_permille": 0, "write_depth": 2}
    tunables = {"fios": {"alpha_permille": 500, "cost_read_4k_ns": 470_000}}
    script, _ = efficiency_script(2, ("fios-1r7w",), EFFICIENCY_DEVICES, settings)(2, 1.0, tunables)
    for dev in EFFICIENCY_DEVICES:
        iosched = f"/sys/block/{dev}/queue/iosched"
        # every fios run (two rounds) gets the variant's values, after the calibrated ones
        assert script.count(f"echo 0 > {iosched}/alpha_permille") == 2
        assert script.count(f"echo 2 > {iosched}/write_depth") == 2
        assert f"echo 500 > {iosched}/alpha_permille" not in script
    # the calibration still goes to flashsim's fios
    assert script.count("echo 470000 > /sys/block/flashsim0/queue/iosched/cost_read_4k_ns") == 2
    # mq-deadline's runs are as they were: nothing is written under their iosched/
    mq = script.split("echo mq-deadline >")[1].split("RESULT-BEGIN")[0]
    assert "iosched/" not in mq
    # a value that does not read back as written (fios refuses one out of its range) is said
    # so by the guest, and the boot reports it among its problems: the run is not taken for
    # the variant asked for
    for dev in EFFICIENCY_DEVICES:
        path = f"/sys/block/{dev}/queue/iosched/alpha_permille"
        assert f'test "$(cat {path})" = 0 || echo {TUNABLE_NOT_SET} alpha_permille=0' in script
    console = f"fio ...\r\n{TUNABLE_NOT_SET} write_depth=100000 256\r\nBLKPILOT-RESULT-BEGIN x\r\n"
    assert Boot(console, 1.0).kernel_problems() == [
        "a tunable did not take: write_depth=100000 (reads 256)"
    ]
    assert Boot("fio ...\r\n", 1.0).kernel_problems() == []
    # the names are fios.c's own; a misspelt one or a value that is not a number is refused
    assert {"alpha_permille", "lend_permille", "cost_write_128k_ns"} <= set(fios_tunable_names())
    for bad in (["alpah_permille=0"], ["alpha_permille=-1"], ["alpha_permille"]):
        with pytest.raises(ValueError, match="not a fios tunable setting"):
            fios_settings(bad)


def _case(rounds: list[tuple[float, float, float]]) -> dict[str, object]:
    """A summarized case from (efficiency ratio, fios' user µs a request, mq-deadline's)."""
    return {
        "ratios": [ratio for ratio, _, _ in rounds],
        "guest_cpu": {
            "fios": [{"user_us_per_io": f} for _, f, _ in rounds],
            "mq-deadline": [{"user_us_per_io": m} for _, _, m in rounds],
        },
    }


def _noise(factor: float, slope: float) -> list[tuple[float, float, float]]:
    """Rounds whose ratio is `factor` times the emulator's noise: the ratio of the two runs'
    fio user CPU to the power `slope`, with a little scatter of its own."""
    users = [0.6, 0.8, 1.0, 1.25, 1.5, 0.7, 1.1, 1.4]
    scatter = [1.01, 0.99, 1.0, 1.01, 0.99, 1.0, 0.99, 1.01]
    return [(factor * u**slope * e, 40.0 * u, 40.0) for u, e in zip(users, scatter, strict=True)]


def test_null_blk_rounds_are_compared_at_equal_user_cpu() -> None:
    """Ratios that swing with the emulator's speed but are 1 where both runs' fio user CPU
    is the same read as parity, within an interval that holds 1; a true 10 % cost reads as
    0.9, with an interval below 1; flashsim's rounds are not in the fit."""
    even = at_equal_user_cpu(
        {"a@nullb0": _case(_noise(1.0, -0.3)), "a": _case([(0.5, 80.0, 40.0)] * 4)}
    )
    assert even is not None
    assert even["rounds"] == 8  # the flashsim case's four are left out
    assert even["low"] <= 1.0 <= even["high"]
    assert even["slope"] == pytest.approx(-0.3, abs=0.05)
    assert even["spearman"] < -0.9
    costly = at_equal_user_cpu({"a@nullb0": _case(_noise(0.9, -0.3))})
    assert costly is not None
    assert costly["high"] < 1.0
    assert costly["ratio"] == pytest.approx(0.9, abs=0.01)
    # too few rounds, or none with the guest's CPU, say nothing
    assert at_equal_user_cpu({"a@nullb0": _case(_noise(1.0, -0.3)[:3])}) is None
    assert at_equal_user_cpu({"a@nullb0": {"ratios": [0.9] * 6, "guest_cpu": {}}}) is None


def test_boots_pool_their_rounds_per_case() -> None:
    """Two boots' rounds of a case are one sample: its geometric mean and interval, and the
    rounds fios was at least as efficient in. A boot recorded before the guest's CPU was
    read still counts in the case's ratios, not in the fit at equal user CPU."""
    first = {"commit": "aaa", "cases": {"b": _case([(0.9, 1, 1), (0.92, 1, 1)])}}
    second = {"commit": "bbb", "cases": {"b": {"ratios": [0.94, 1.02]}}}
    found = pooled([first, second])
    value, low, high = found["cases"]["b"]
    assert value == pytest.approx((0.9 * 0.92 * 0.94 * 1.02) ** 0.25, rel=1e-4)
    assert low < value < high < 1.05
    assert found["table"].startswith("b: ")
    assert found["table"].endswith("(1/4)")
    assert found["boots"] == "aaa, bbb"
    assert found["null_rounds"] == 0
    assert found["at_equal_user_cpu"] is None
