"""fios calibration by the agent: four standalone points measured with fio on a real scratch
loop device, costs from the block layer's own accounting, never a write to a data device."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent import calibrate
from agent.applier import plan
from agent.bench import fio
from agent.bench.target import device_target
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.workloads import IOPattern
from agent.discovery import KernelFacts
from agent.errors import BenchmarkFailed
from agent.host import HostPaths
from tests.agent.conftest import LoopFactory


def test_four_standalone_qd1_points() -> None:
    specs = calibrate.workloads(seconds=1.0)
    assert set(specs) == set(calibrate.POINTS)
    for tunable, spec in specs.items():
        (job,) = spec.jobs
        pattern, size = calibrate.POINTS[tunable]
        assert (job.pattern, job.block_sizes, job.queue_depth, job.tasks) == (
            pattern,
            {size: 100},
            1,
            1,
        )
        assert spec.writes is (pattern is IOPattern.RANDWRITE)


def test_block_layer_time_from_two_stat_readings() -> None:
    before = "1000 0 8000 100 10 0 80 40 0 50 140 0 0 0 0 0 0"
    after = "5000 0 40000 420 30 0 240 240 0 300 660 0 0 0 0 0 0"
    # 4000 reads in 320 ms of ticks: 80 µs each
    assert calibrate.block_layer_ns("cost_read_4k_ns", before, after) == pytest.approx(80_000)
    # 20 writes in 200 ms: 10 ms each
    assert calibrate.block_layer_ns("cost_write_4k_ns", before, after) == pytest.approx(1e7)
    # too few ticks to trust the ms counter, or nothing completed, or garbage: not usable
    assert calibrate.block_layer_ns("cost_read_4k_ns", before, before) is None
    assert calibrate.block_layer_ns("cost_read_4k_ns", before, "1001 0 8 101 10") is None
    assert calibrate.block_layer_ns("cost_read_4k_ns", before, "x y") is None


def test_a_scratch_device_is_calibrated(loop_device: LoopFactory, tmp_path: Path) -> None:
    device = loop_device(size_mb=64)
    target = device_target(HostPaths(), device)
    found = calibrate.measure(target, workdir=tmp_path / "work", seconds=0.5)
    assert found.calibrated, found.note
    # the device's own accounting, not fio's latency (a point charged flat is said after a ';')
    assert "(block layer)" in found.note or "(block layer; " in found.note, found.note
    # a memory-backed loop device has no size-dependent cost to speak of (the 4 KiB and
    # 128 KiB points swap places under load), so only their plausibility is checked here;
    # the size dependence is checked on flashsim in the kernel lab
    assert all(1_000 < cost < 10_000_000 for cost in found.costs.values()), found.costs

    store = calibrate.CalibrationStore(tmp_path / "state")
    store.put(found)
    assert store.get(device) == found
    assert store.forget(device)
    assert store.get(device) is None


def test_a_device_holding_data_is_not_written(loop_device: LoopFactory, tmp_path: Path) -> None:
    device = loop_device(size_mb=64)
    subprocess.run(["mkfs.ext4", "-q", f"/dev/{device}"], check=True)
    before = Path(f"/sys/block/{device}/stat").read_text().split()
    target = device_target(HostPaths(), device)
    found = calibrate.measure(target, workdir=tmp_path / "work", seconds=0.5)
    assert not found.calibrated
    assert found.costs == {}
    assert "holds data" in found.note
    assert "elapsed time / parallelism" in found.note
    after = Path(f"/sys/block/{device}/stat").read_text().split()
    assert after[4] == before[4]  # writes completed: unchanged


def test_measured_costs_and_alpha_complete_the_policy() -> None:
    calibration = calibrate.Calibration(
        "flashsim0",
        {name: 1_000 * (i + 1) for i, name in enumerate(calibrate.POINTS)},
        "2026-11-21T00:00:00+00:00",
        "calibrated",
    )
    policy = DeviceConfig(scheduler=Scheduler.FIOS, scheduler_tunables={"alpha_permille": 300})
    assert calibrate.needs_calibration(policy)
    config = calibrate.with_costs(policy, calibration)
    assert config.scheduler_tunables == {"alpha_permille": 300, **calibration.costs}
    assert not calibrate.needs_calibration(config)
    # the writes the applier makes: the scheduler first, then every tunable under iosched/
    kernel = KernelFacts("6.1.0-18-amd64", (6, 1))
    writes = plan(config, kernel, "none")
    assert next(iter(writes)) == "scheduler"
    assert writes["scheduler"] == "fios"
    assert writes["iosched/cost_write_128k_ns"] == "4000"
    assert writes["iosched/alpha_permille"] == "300"
    # without a policy alpha, the paper's 0.5; other schedulers are left alone
    bare = calibrate.with_costs(DeviceConfig(scheduler=Scheduler.FIOS), calibration)
    assert bare.scheduler_tunables["alpha_permille"] == 500
    other = DeviceConfig(scheduler=Scheduler.BFQ)
    assert calibrate.with_costs(other, calibration) == other


def test_an_uncalibrated_device_keeps_the_policy_as_it_is() -> None:
    empty = calibrate.Calibration("sda", {}, "", "not calibrated")
    policy = DeviceConfig(scheduler=Scheduler.FIOS)
    assert calibrate.with_costs(policy, empty).scheduler_tunables == {"alpha_permille": 500}
    assert not empty.calibrated


def _fio(mean_us: float) -> fio.FioResult:
    task = fio.TaskResult("calibrate", 0, 1000, 4096 * 1000, 1000.0, mean_us, mean_us, mean_us)
    return fio.FioResult([task], {})


@pytest.mark.parametrize(
    ("points_us", "outcome"),
    [
        # read 4k, read 128k, write 4k, write 128k (µs)
        ((50, 200, 80, 900), "as measured"),
        ((50, 45, 80, 900), "read flat"),  # 10 % below: noise, charged flat
        ((50, 200, 900, 80), "refused"),  # the review's case: a 1 MiB write at 1 µs
    ],
)
def test_calibrated_costs_grow_with_size(points_us: tuple[int, ...], outcome: str) -> None:
    """fios charges a request by the line through its direction's two points: a 128 KiB point
    below the 4 KiB one is repaired (within SIZE_NOISE) or the calibration refused — never
    written to the device."""
    results = {name: _fio(us) for name, us in zip(calibrate.POINTS, points_us, strict=True)}
    if outcome == "refused":
        with pytest.raises(BenchmarkFailed, match="do not grow with size: a 128 KiB write"):
            calibrate.costs_from(results)
        return
    costs, source = calibrate.costs_from(results)
    assert costs["cost_read_128k_ns"] >= costs["cost_read_4k_ns"]
    assert costs["cost_write_128k_ns"] >= costs["cost_write_4k_ns"]
    if outcome == "read flat":
        assert costs["cost_read_128k_ns"] == costs["cost_read_4k_ns"] == 50_000
        assert "read charged flat" in source
    else:
        assert costs == {n: us * 1000 for n, us in zip(calibrate.POINTS, points_us, strict=True)}
        assert source == "fio latency"


def test_a_round_that_contradicts_itself_does_not_refuse_the_calibration() -> None:
    """A CI run on a shared host measured one round's 4 KiB read at 20.6 µs and its 128 KiB
    read at 14.2 µs. That round is set aside; the least of each point over the usable rounds is
    kept (other work only adds time), from one source."""
    rounds = [(50, 200, 80, 900), (206, 142, 80, 900), (70, 180, 60, 1000)]
    measured, failures = [], []
    for points_us in rounds:
        results = {name: _fio(us) for name, us in zip(calibrate.POINTS, points_us, strict=True)}
        try:
            measured.append(calibrate.costs_from(results))
        except BenchmarkFailed as failed:
            failures.append(str(failed))
    assert len(failures) == 1
    costs, source = calibrate.least_of(measured, failures)
    assert costs == {
        "cost_read_4k_ns": 50_000,
        "cost_read_128k_ns": 180_000,
        "cost_write_4k_ns": 60_000,
        "cost_write_128k_ns": 900_000,
    }
    assert source == "fio latency; least of 2 usable round(s) of 3"
    # block-layer rounds win over fio-latency ones: the two are not mixed
    block = ({name: 1_000 for name in calibrate.POINTS}, "block layer")
    assert calibrate.least_of([*measured, block], [])[0] == block[0]
    with pytest.raises(BenchmarkFailed, match=r"no calibration round was usable: .*128 KiB read"):
        calibrate.least_of([], failures)
