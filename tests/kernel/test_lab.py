"""The kernel lab for real: Debian's 6.1 kernel under QEMU (TCG), null_blk, fio in the guest."""

from __future__ import annotations

import pytest

from kernel.lab import packages
from kernel.lab.scenarios import STOCK, LabResult, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def overhead() -> LabResult:
    return run("null-overhead", rounds=2, seconds=1.5)


def test_the_trio_shares_one_version() -> None:
    trio = packages.select_trio()
    assert trio.abi.startswith("6.1.0-")
    assert trio.version in packages.versions("linux-source-6.1")
    assert trio.version in packages.versions(f"linux-headers-{trio.abi}")


def test_every_scheduler_ran_in_every_round(overhead: LabResult) -> None:
    assert overhead.kernel.startswith("6.1.0-")
    assert sorted(overhead.runs) == sorted(f"{s}/{r}" for s in STOCK for r in range(2))
    assert all(m["iops"] > 0 and m["lat_mean_us"] > 0 for m in overhead.runs.values())


def test_every_scheduler_adds_latency_over_none(overhead: LabResult) -> None:
    """HotStorage '23: on a fast device every scheduler adds latency to 4 KB QD1 reads.
    Under TCG the numbers are inflated and short runs are noisy, so the finer order
    (mq-deadline ≈ kyber < bfq) is left to bench/lab_overhead.py's longer runs."""
    relative = overhead.summary["relative_to_none"]
    for scheduler in ("mq-deadline", "kyber", "bfq"):
        assert relative[scheduler] > 1.05, relative


def test_no_warnings_in_the_kernel_log(overhead: LabResult) -> None:
    assert overhead.kernel_problems == []


@pytest.fixture(scope="module")
def flash_fairness() -> LabResult:
    return run("flash-fairness-1r1w", seconds=1.5)


def test_flashsim_builds_against_the_lab_kernel(flash_fairness: LabResult) -> None:
    from kernel.lab import build

    trio = packages.select_trio()
    module = packages.DEFAULT_CACHE / trio.version / "build" / "flashsim" / "flashsim.ko"
    assert build.vermagic(module).startswith(f"{trio.abi} SMP")


def test_reads_are_blocked_by_writes_on_the_test_device(flash_fairness: LabResult) -> None:
    """The FIOS paper's premise, on flashsim: with no scheduling, a reader next to a writer
    slows down far more than the writer does."""
    cases = flash_fairness.summary["fios-1r1w"]
    assert set(cases) == set(STOCK)
    none = cases["none"]["slowdowns"]
    assert none["reader_0"] > 1.3 * none["writer_0"]
    assert all(case["proportional_slowdown"] == 2 for case in cases.values())
    assert all(0 < case["concurrent_efficiency"] <= 2.0 for case in cases.values())


def test_flashsim_loads_serves_and_unloads_cleanly(flash_fairness: LabResult) -> None:
    assert flash_fairness.kernel_problems == []  # includes the rmmod check


def test_polling_completes_only_when_the_device_is_done() -> None:
    """HotStorage '22 on flashsim: polling saves the interrupt path and its context switches,
    but cannot make the device itself faster than its service time."""
    result = run("flash-polling", rounds=1, seconds=1.0)
    assert result.kernel_problems == []
    summary = result.summary
    for device in ("ull", "flash"):
        for size in ("4k", "128k"):
            irq, poll = summary[f"{device}/{size}/interrupt"], summary[f"{device}/{size}/classic"]
            assert poll["context_switches_per_io"] < 0.2 < 0.8 < irq["context_switches_per_io"]
            assert poll["lat_mean_us"] < irq["lat_mean_us"]
    # the flash-like device's 80 µs read time shows through polling: no instant completions
    assert summary["flash/4k/classic"]["lat_p50_us"] > 80
