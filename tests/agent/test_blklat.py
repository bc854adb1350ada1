"""The eBPF latency collector on real I/O: a loop device holding ext4 with files, fio reading a
file in it. Its percentiles are checked against fio's own for the same I/Os; windows carry the
distributions, validated; where eBPF cannot run, windows say so and carry no percentile.

The tolerance, and why: eBPF times a request inside the block layer (issue to completion).
fio's total latency holds that span whole, so eBPF may not exceed it by more than a bucket (at
most 12.5 % wide). fio is no lower bound on a busy host: the time fio waits for a CPU lands
above the device (its completion p50 was 11 us above eBPF's in a CI run). The lower side is
held by the kernel's own accounting instead (diskstats, allocation to end), which a busy CPU
cannot skew."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.collectors.blklat import BlkLatCollector
from agent.collectors.diskstats import DiskstatsCollector
from agent.config import AgentConfig
from agent.contract import histograms
from agent.contract.wire import IoOperation, LatencySource, OperationLatency, TelemetryWindow
from agent.host import HostPaths
from agent.telemetry import Collection, histogram_delta, windows
from kernel.lab.devices import TMPFS, DataDevice, data_device, start_workload, stop_workload

BUCKET = 0.125


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataDevice]:
    mount = tmp_path_factory.mktemp("data")
    backing = TMPFS / f"blkpilot-test-blklat-{uuid.uuid4().hex[:8]}.img"  # unique per worker
    with data_device(backing, 512 << 20, mount) as dev:
        yield dev
    assert dev.fsck == "", dev.fsck


@pytest.fixture(scope="module")
def collector() -> Iterator[BlkLatCollector]:
    found = BlkLatCollector(HostPaths())
    assert found.available, found.unavailable  # root, BTF and the object: present here
    yield found
    found.close()


def collect(collector: BlkLatCollector) -> Collection:
    disks = DiskstatsCollector(HostPaths()).collect(0)
    return Collection(time.time(), time.monotonic(), disks, None, [], collector.collect(0))


def test_percentiles_agree_with_fio_for_the_same_io(
    device: DataDevice, collector: BlkLatCollector
) -> None:
    untimed = collector.untimed()
    before = collect(collector)
    fio = start_workload(device.data_file, iodepth=1, seconds=3)
    report = json.loads(stop_workload_after(fio, 5))
    after = collect(collector)
    # one request in flight: none can take another's slot of the request table (the machine's
    # own disk's rare requests aside: one in 131072 of theirs)
    assert collector.untimed() == untimed
    _, found = windows(before, after, {device.name})
    (window,) = found
    assert window.latency_source is LatencySource.EBPF
    reads = next(o for o in window.operations if o.op is IoOperation.READ)
    job = report["jobs"][0]["read"]
    # the same I/Os: every read fio made reached the device once (no cache, direct I/O); the
    # filesystem may add a few metadata reads of its own. A few reads below fio's count have
    # been seen in the full suite — 1 of 122,443 once, 3 of 120,158 once (07c4433), with no
    # request left untimed — so the floor is fio's count less 1 in 10,000 (and two): a
    # collector that loses events at any rate that matters (0.1 %) still fails here
    assert job["total_ios"] * 0.9999 - 2 <= reads.count <= job["total_ios"] * 1.01 + 16

    def percentiles(kind: str) -> dict[str, float]:
        found = job[kind]["percentile"]
        return {k: found[v] / 1000 for k, v in {"p50": "50.000000", "p99": "99.000000"}.items()}

    # fio's total latency (submission and completion) holds the device's time whole
    total = percentiles("lat_ns")
    measured = {"p50": reads.p50_us, "p99": reads.p99_us}
    for name in ("p50", "p99"):
        assert measured[name] <= total[name] * (1 + BUCKET) + 1, (name, measured, total)
    # the lower side against the kernel's own accounting, which a busy CPU cannot skew: diskstats
    # times each request from its allocation to its end, a span that holds eBPF's (issue to the
    # completion event) whole. So eBPF's mean is never above diskstats' (within its millisecond
    # counters), and what lies outside eBPF's span — allocation, the plug, io_uring's batch — was
    # 12-25 % of it here (quiet and under one and two CPU hogs, 2026-11-25). A bucket, unit or
    # mapping error of a factor of two would fall far outside. (fio's completion latency is no
    # lower bound on a busy host: its p50 was 11 us above eBPF's in CI)
    low_mean, high_mean = mean_bounds_us(window.operations)
    counted = window.mean_latency_us
    slack = 1000 / (window.read_ios + window.write_ios)  # one ms lost to the counters' rounding
    assert low_mean <= counted + slack, (low_mean, counted)
    assert high_mean >= 0.6 * counted, (high_mean, counted)
    assert measured["p50"] <= measured["p99"]
    # 4 KiB requests, all of them; sizes and counts agree
    assert reads.size_bytes == [(12, reads.count)]


def mean_bounds_us(operations: list[OperationLatency]) -> tuple[float, float]:
    """The mean device time of reads and writes, held between its buckets' low and high ends."""
    merged = histograms.merge(
        o.device_ns for o in operations if o.op in (IoOperation.READ, IoOperation.WRITE)
    )
    count = sum(n for _, n in merged)
    bounds = [(histograms.latency_bounds(slot), n) for slot, n in merged]
    low = sum(lo * n for (lo, _), n in bounds) / count / 1000
    high = sum(hi * n for (_, hi), n in bounds) / count / 1000
    return low, high


def stop_workload_after(process: subprocess.Popen[str], seconds: float) -> str:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=seconds)
    return stop_workload(process)


def test_windows_carry_queue_time_where_a_scheduler_queues(
    device: DataDevice, collector: BlkLatCollector
) -> None:
    scheduler = Path(f"/sys/block/{device.name}/queue/scheduler")
    scheduler.write_text("mq-deadline")
    try:
        before = collect(collector)
        stop_workload_after(start_workload(device.data_file, iodepth=8, seconds=1.5), 4)
        after = collect(collector)
    finally:
        scheduler.write_text("none")
    _, (window,) = windows(before, after, {device.name})
    reads = next(o for o in window.operations if o.op is IoOperation.READ)
    assert histograms.check(reads.queue_ns, histograms.LATENCY_SLOTS) > 0


def test_only_histograms_that_moved_are_decoded_again(
    device: DataDevice, collector: BlkLatCollector
) -> None:
    """Decoding every histogram at every collection was most of the agent's CPU at 1 s windows
    (bench/agent_footprint.py): a histogram whose count has not moved is handed back as it was,
    one that moved is read anew, and the window between them counts exactly the new I/O."""
    stop_workload_after(start_workload(device.data_file, iodepth=1, seconds=0.5), 3)
    first = collector.collect(0)
    again = collector.collect(0)
    mine = [key for key in first.histograms if key[0] == device.name]
    assert mine, first.histograms.keys()
    for key in mine:
        assert again.histograms[key] is first.histograms[key]
    stop_workload_after(start_workload(device.data_file, iodepth=1, seconds=0.5), 3)
    moved = collector.collect(0)
    reads = [k for k in mine if k[1] is IoOperation.READ and k[2] == "device_ns"]
    assert any(moved.histograms[k] is not first.histograms[k] for k in reads)
    grown = sum(
        sum(moved.histograms[k].values()) - sum(first.histograms[k].values()) for k in reads
    )
    assert grown > 0
    assert grown == sum(
        count
        for k in reads
        for _, count in histogram_delta(first.histograms[k], moved.histograms[k])
    )


def test_a_collector_for_some_devices_reads_only_theirs(device: DataDevice) -> None:
    """The programs trace every device; an agent watching some reads only theirs."""
    mine = BlkLatCollector(HostPaths(), devices=[device.name])
    others = BlkLatCollector(HostPaths(), devices=["no-such-device"])
    try:
        stop_workload_after(start_workload(device.data_file, iodepth=1, seconds=0.5), 3)
        assert {key[0] for key in mine.collect(0).histograms} == {device.name}
        assert others.collect(0).histograms == {}
    finally:
        mine.close()
        others.close()


def test_without_ebpf_windows_carry_means_only(device: DataDevice, tmp_path: Path) -> None:
    unavailable = BlkLatCollector(HostPaths(), object_path=tmp_path / "missing.bpf.o")
    assert not unavailable.available
    assert "missing.bpf.o is missing" in unavailable.unavailable
    disks = DiskstatsCollector(HostPaths())
    before = Collection(
        time.time(), time.monotonic(), disks.collect(0), None, [], unavailable.collect(0)
    )
    stop_workload_after(start_workload(device.data_file, seconds=1), 3)
    after = Collection(
        time.time(), time.monotonic(), disks.collect(0), None, [], unavailable.collect(0)
    )
    _, (window,) = windows(before, after, {device.name})
    assert window.latency_source is LatencySource.DISKSTATS
    assert window.operations == []
    assert "missing" in window.latency_note
    assert window.mean_latency_us > 0


def test_a_fixture_sys_is_not_traced() -> None:
    config = AgentConfig(sys_root=Path("/nonexistent/sys"))
    assert "eBPF traces this kernel" in BlkLatCollector(config.paths).unavailable


def test_the_wire_refuses_inconsistent_distributions(
    device: DataDevice, collector: BlkLatCollector
) -> None:
    before = collect(collector)
    stop_workload_after(start_workload(device.data_file, seconds=1), 3)
    after = collect(collector)
    _, (window,) = windows(before, after, {device.name})
    good = window.model_dump(mode="json")
    TelemetryWindow.model_validate(good)

    def refused(change: dict[str, object], match: str) -> None:
        bad = json.loads(json.dumps(good))
        reads = next(o for o in bad["operations"] if o["op"] == "read")
        reads.update(change)
        with pytest.raises(ValidationError, match=match):
            TelemetryWindow.model_validate(bad)

    reads = next(o for o in good["operations"] if o["op"] == "read")
    refused({"device_ns": list(reversed(reads["device_ns"]))}, "increase strictly")
    refused({"count": reads["count"] + 1}, "do not add up")
    refused({"p99_us": reads["p50_us"] / 2}, "must not decrease")
    refused({"p50_us": reads["p50_us"] * 0.8}, "not the histogram's")
    # counts that disagree with diskstats' for the window
    bad = json.loads(json.dumps(good))
    bad["read_ios"] = reads["count"] * 3 + 1000
    with pytest.raises(ValidationError, match="diskstats counts"):
        TelemetryWindow.model_validate(bad)
    # a diskstats window carries no distribution
    bad = json.loads(json.dumps(good))
    bad["latency_source"] = "diskstats"
    with pytest.raises(ValidationError, match="means only"):
        TelemetryWindow.model_validate(bad)


@pytest.mark.parametrize("value", [0, 1, 7, 8, 9, 15, 16, 17, 1000, 12_345, 10**9])
def test_latency_slots_hold_their_values(value: int) -> None:
    low, high = histograms.latency_bounds(histograms.latency_slot(value))
    assert low <= value < high
    assert high - low <= max(1.0, BUCKET * low)


def test_tracefs_is_mounted_when_missing() -> None:
    tracing = Path("/sys/kernel/tracing")
    if os.path.ismount(tracing):
        subprocess.run(["umount", str(tracing)], check=True)
    assert not os.path.ismount(tracing)
    found = BlkLatCollector(HostPaths())
    try:
        assert found.available, found.unavailable
        assert os.path.ismount(tracing)
    finally:
        found.close()


def _attached_programs() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:bpf-prog"
    return count


def test_programs_are_detached_when_their_collector_goes(tmp_path: Path) -> None:
    """Every collector left attached would trace every I/O of the host from then on."""
    import gc

    from agent.runner import Agent

    before = _attached_programs()
    agent = Agent(AgentConfig(metrics_port=0), None, tmp_path)
    assert _attached_programs() == before + 4  # bio queue, insert, issue, complete
    del agent
    gc.collect()
    assert _attached_programs() == before
    closed = BlkLatCollector(HostPaths())
    closed.close()
    assert _attached_programs() == before


def test_the_cost_benchmark_switches_the_programs_and_leaves_none_behind() -> None:
    """bench.bpf_cost, short: its phases really alternate between the programs attached and
    detached, bpf_stats sees three runs an I/O without a scheduler (bio queue, issue,
    completion), and the statistics and the programs are left as they were found. The
    figure itself (ns per I/O) is the benchmark's, not asserted here."""
    from bench import bpf_cost

    stats = bpf_cost.STATS.read_text()
    before = bpf_cost.attached_programs()
    result = bpf_cost.run(rounds=3, seconds=0.5, settle=0.3, scheduler="none", seed=3)
    assert result["programs_on_off"] == [(before + 4, before)]
    assert result["iops_on"] > 0
    assert result["iops_off"] > 0
    assert 2.5 <= result["bpf_stats_runs_per_io"] <= 3.5
    assert len(result["rounds_ns"]) == 3
    assert bpf_cost.attached_programs() == before
    assert bpf_cost.STATS.read_text() == stats


def test_a_wait_for_a_tag_counts_as_the_application_sees_it(
    device: DataDevice, collector: BlkLatCollector
) -> None:
    """A depth limit (nr_requests 4 under eight readers) holds requests before they exist:
    insert -> completion missed that wait, and a depth-limiting candidate looked 71 % faster
    while pgbench saw nothing. The judged latency (total_ns) now runs from the bio's
    submission, and holds most of what fio, the application here, waits (insert -> completion
    held a third of it: 19.5 against fio's 60.7 us p50, 2026-11-25); device time is kept
    beside it, and is a fraction of it (20 against 42 us)."""
    from agent.telemetry import device_deltas

    queue = Path(f"/sys/block/{device.name}/queue")
    depth = (queue / "nr_requests").read_text().strip()
    (queue / "nr_requests").write_text("4")
    try:
        before = collect(collector)
        report = json.loads(
            stop_workload_after(
                start_workload(device.data_file, iodepth=1, jobs=8, engine="psync", seconds=3), 5
            )
        )
        after = collect(collector)
    finally:
        (queue / "nr_requests").write_text(depth)
    assert before.latency is not None
    assert after.latency is not None
    found = device_deltas(device.name, before.latency, after.latency)
    total = histograms.merge(h for (op, kind, _), h in found.items()
                             if op is IoOperation.READ and kind == "total_ns")  # fmt: skip
    device_time = histograms.merge(h for (op, kind, _), h in found.items()
                                   if op is IoOperation.READ and kind == "device_ns")  # fmt: skip
    total_p50 = (histograms.quantile(total, 0.5) or 0.0) / 1000
    device_p50 = (histograms.quantile(device_time, 0.5) or 0.0) / 1000
    fio_p50 = report["jobs"][0]["read"]["lat_ns"]["percentile"]["50.000000"] / 1000
    figures = (total_p50, device_p50, fio_p50)
    # under `none` no request is inserted: from insert, total was issue -> completion, the
    # same histogram as device time, I/O for I/O. From the bio it holds the wait for a tag:
    # more on every count (quiet: 42 against 20 us p50; a CPU hog on one core leaves fewer
    # readers submitting at once, and less wait: 28 against 24)
    assert total_p50 >= device_p50, figures
    assert _mean_us(total) >= 1.05 * _mean_us(device_time), (_mean_us(total), figures)
    # and never more than the application itself waited (fio's, with its syscall around it)
    assert total_p50 <= 1.25 * fio_p50 + 5, figures


def _mean_us(histogram: histograms.Sparse) -> float:
    """The mean of a latency histogram, each slot at its middle."""
    count = sum(n for _, n in histogram)
    middle = [(sum(histograms.latency_bounds(slot)) / 2, n) for slot, n in histogram]
    return sum(value * n for value, n in middle) / max(count, 1) / 1000
