"""Short versions of the fleet-scale benchmarks (bench/fleet.py, bench/ingest.py,
bench/partitions), so that the suite runs what they measure: every window sent is stored, the
sizes and read paths are measured. The figures themselves belong to the recorded runs
(bench/results/)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.fleet import Timer

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> dict[str, object]:
    # a temporary directory of the run's own (the suite's other workers make theirs in /tmp
    # at the same time), short enough for PostgreSQL's socket path
    scratch = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", *args, "--no-record"],
            cwd=ROOT,
            env={**os.environ, "TMPDIR": str(scratch)},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: below a target, not an error
        start = done.stdout.index("{\n")
        end = done.stdout.rindex("\n}") + 2
        result: dict[str, object] = json.loads(done.stdout[start:end])
        # its database and logs are gone (a run used to leave 283 MB behind)
        assert not list(scratch.glob("blkpilot-*")), list(scratch.iterdir())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


@pytest.mark.timeout(600)
def test_a_small_fleet_enrolls_posts_and_reads() -> None:
    result = _run("bench.fleet", "--nodes", "30", "--intervals", "2", "--reads", "2")
    assert result["windows"] == 30 * 16 * 2
    # as an agent at its defaults pushes (30 s of 10 s windows): both intervals in one request
    assert result["windows_per_request"] == 16 * 2
    assert isinstance(result["raw_bytes_per_window"], float)
    assert 50 < result["raw_bytes_per_window"] < 5_000
    assert 0 < result["hourly_bytes_per_row"] < 5_000  # type: ignore[operator]
    reads = result["read_p95_ms"]
    assert isinstance(reads, dict)
    assert set(reads) >= {"device list", "device list, deep page", "fleet page", "device page"}
    first = result["read_first_ms"]
    assert isinstance(first, dict)
    assert set(first) == {"fleet page", "device page"}
    # the service's cost per request in CPU time from /proc (a 10 ms tick: some, over 60)
    assert result["serve_cpu_ms_per_request"] > 0  # type: ignore[operator]


@pytest.mark.timeout(600)
def test_a_fleet_at_its_own_pace_is_answered_before_its_next_push() -> None:
    """--paced: each node's push sent when due, spread over the push interval (10 s here, a
    window to a push), not as fast as the service answers — so the run takes the interval
    and the rate is the fleet's own, and each push's lag is measured against the next."""
    result = _run(
        "bench.fleet", "--nodes", "20", "--intervals", "1", "--push-intervals", "1",
        "--reads", "1", "--paced",
    )  # fmt: skip
    assert result["windows"] == 20 * 16
    # 20 pushes due over 10 s, the last 9.5 s in: not all at once (320 windows in a second)
    assert result["windows_per_second"] <= 1.1 * 320 / 9.5, result  # type: ignore[operator]
    # each push answered before its node's next is due (whether the run finished on schedule,
    # `keeps_up`, is the recorded runs' to say: the suite's machine is busy)
    assert 0 <= result["lag_p50_ms"] <= result["lag_p99_ms"] < 10_000, result  # type: ignore[operator]


def test_a_read_p95_is_by_nearest_rank() -> None:
    """One cold page in 20 is not the p95 (it was, by int(0.95 * 20) = the 20th)."""
    timer = Timer()
    for seconds in [1.2] + [0.03] * 19:
        timer.add("fleet page", seconds)
    assert timer.p("fleet page", 0.95) == pytest.approx(30)
    assert timer.p("fleet page", 1.0) == pytest.approx(1200)
    assert timer.first("fleet page") == pytest.approx(1200)
    timer.add("fleet page", 1.2)  # two slow in 21: the 20th of 21 is one of them
    assert timer.p("fleet page", 0.95) == pytest.approx(1200)


@pytest.mark.timeout(600)
def test_ingest_and_copy_are_measured_in_one_run() -> None:
    result = _run(
        "bench.ingest", "--clients", "2", "--batches", "10", "--windows", "200", "--replicas", "2"
    )
    assert result["windows"] == 2 * 10 * 200
    assert result["replicas"] == 2
    share = result["share_of_copy"]
    assert isinstance(share, float)
    assert 0 < share < 1  # the HTTP path stores fewer rows a second than COPY alone
    # CPU time per unit of work, from /proc (in 10 ms ticks: 4,000 windows are enough to
    # show some): serve's and PostgreSQL's
    assert result["serve_cpu_us_per_window"] > 0  # type: ignore[operator]
    assert result["postgres_cpu_us_per_window"] > 0  # type: ignore[operator]
    stages = result["python_stages"]
    assert isinstance(stages, dict)
    assert all(v > 0 for v in stages.values()), stages


@pytest.mark.timeout(600)
def test_the_storing_statement_is_split_from_copy_in_postgres_cpu() -> None:
    """bench.ingest_statement: every batch stored by the statement, its arrays read alone,
    stored by the JSON statement before it and COPYed (each asserts its row count), and the
    backend's CPU a window of each — the statement, which takes the same arrays apart and
    inserts too, costs more than taking them apart alone."""
    result = _run("bench.ingest_statement", "--batches", "6", "--windows", "200", "--rounds", "1")
    costs = {
        way: result[f"{way}_us_per_window"] for way in ("statement", "arrays_alone", "json", "copy")
    }
    assert all(isinstance(c, list) and c and all(x > 0 for x in c) for c in costs.values())
    assert costs["statement"][0] > costs["arrays_alone"][0], result  # type: ignore[index]


def test_partition_sizes_are_measured_against_each_other() -> None:
    result = _run("bench.partitions", "--devices", "2", "--repeats", "5")
    sizes = result["sizes"]
    assert isinstance(sizes, dict)
    assert list(sizes) == ["hour", "day", "week"]
    # 14 days of retention and 3 ahead, on each size's boundaries
    assert 17 * 24 <= sizes["hour"]["partitions"] <= 17 * 24 + 1
    assert 17 <= sizes["day"]["partitions"] <= 18
    assert 3 <= sizes["week"]["partitions"] <= 4
    assert all(s["windows"] == 2 * 14 * 8_640 for s in sizes.values())
    # a read with no time bound plans a branch per partition: hours cost the planner most
    assert sizes["hour"]["newest_planning_ms"] > sizes["day"]["newest_planning_ms"]
    # a day later, hours and days drop what passed the horizon; a week may not yet have
    assert sizes["hour"]["partitions_dropped_a_day_later"] >= 24
    assert sizes["day"]["partitions_dropped_a_day_later"] >= 1
    assert sizes["week"]["retained_beyond_horizon_share"] == 0.5


def _serving_from(data_dir: Path) -> list[int]:
    """The processes whose BLKPILOT_DATA_DIR is data_dir (the benchmark's `serve` replicas)."""
    wanted = f"BLKPILOT_DATA_DIR={data_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(300)
def test_a_benchmark_stopped_by_sigterm_stops_and_removes_what_it_started() -> None:
    """bench.unwind: SIGTERM in the middle of bench.ingest stops its `serve` and its embedded
    PostgreSQL and removes its data directory (Python's default left all three running and
    on disk: hundreds of MB a run)."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    serving: list[int] = []
    postmaster = 0
    try:
        bench = subprocess.Popen(
            # batches enough that building them outlasts the test's look around
            [
                sys.executable,
                "-m",
                "bench.ingest",
                *("--clients", "1", "--batches", "1400"),
                *("--windows", "500", "--no-record"),
            ],
            cwd=ROOT,
            env={**os.environ, "TMPDIR": str(scratch)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert bench.stdout is not None
            seen = []
            for line in bench.stdout:  # servers up, the admin's token made
                seen.append(line)
                if line.startswith("building"):
                    break
            else:
                raise AssertionError(f"bench.ingest ended before its servers were up: {seen}")
            (data_dir,) = scratch.glob("blkpilot-bench-*")
            serving = _serving_from(data_dir)
            postmaster = int((data_dir / "db/postgres/postmaster.pid").read_text().split()[0])
            assert serving
            assert all(map(_alive, [*serving, postmaster]))
            bench.terminate()
            assert bench.wait(timeout=120) == 128 + 15
        finally:
            if bench.poll() is None:
                bench.kill()
                bench.wait()
        assert not data_dir.exists()
        assert not any(map(_alive, [*serving, postmaster]))
    finally:
        # what a failed run left: stopped here, not left to the suite's other tests
        left = [*((p, signal.SIGTERM) for p in serving), (postmaster, signal.SIGINT)]
        for pid, sig in left:
            if pid > 0 and _alive(pid):  # never 0: that would signal this process's group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        shutil.rmtree(scratch, ignore_errors=True)
