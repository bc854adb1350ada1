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


def test_schedulers_add_latency_in_the_papers_order(overhead: LabResult) -> None:
    """HotStorage '23: none < mq-deadline ≈ kyber < bfq. Under TCG the absolute numbers are
    inflated; the order holds (KERNEL-LAB.md)."""
    relative = overhead.summary["relative_to_none"]
    assert relative["mq-deadline"] > 1.0
    assert relative["kyber"] > 1.0
    assert relative["bfq"] > max(relative["mq-deadline"], relative["kyber"])


def test_no_warnings_in_the_kernel_log(overhead: LabResult) -> None:
    assert overhead.kernel_problems == []
