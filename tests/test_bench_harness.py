"""The bench harness: every benchmark is listed and runs in its quick mode through
`python -m bench run NAME --quick`, its records go where --out says (never the checkout then),
--no-record writes nothing, the host's load is beside every figure, and what a run started is
stopped when it fails or is interrupted."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bench import harness
from bench.record import RESULTS, ROOT, records, table

# benches whose quick mode another test runs (a boot of the kernel lab, a real application,
# the hostile probe): each names it in the registry
SHORT_HERE = sorted(name for name, bench in harness.BENCHES.items() if not bench.suite)


def _bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _checkout_results() -> dict[str, str]:
    return {
        str(path.relative_to(RESULTS)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(RESULTS.rglob("*"))
        if path.is_file()
    }


def _bench_modules() -> set[str]:
    """Every module of bench/ that runs as a benchmark (`python -m bench.NAME`)."""
    found = set()
    for path in (ROOT / "bench").iterdir():
        if path.suffix == ".py" and 'if __name__ == "__main__"' in path.read_text():
            found.add(path.stem)
        elif (path / "__main__.py").exists():
            found.add(path.name)
    return found - {"__main__"}


def test_every_benchmark_is_listed_with_what_it_measures() -> None:
    assert _bench_modules() == set(harness.BENCHES), "a bench the harness does not know"
    listed = _bench("list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(harness.BENCHES)
    for bench in harness.BENCHES.values():
        assert bench.what
        assert bench.takes
        assert bench.quick_takes
        if bench.suite:
            assert (ROOT / bench.suite).exists(), f"{bench.name}: {bench.suite} is not a test"


@pytest.mark.parametrize("name", SHORT_HERE)
def test_each_quick_mode_runs_and_records_only_where_told(name: str, tmp_path: Path) -> None:
    before = _checkout_results()
    ran = _bench("run", name, "--quick", "--out", str(tmp_path))
    after = _checkout_results()
    assert after == before, "a run with --out wrote into the checkout"
    if name == "bpf_cost" and ran.returncode == 2:
        # its method needs idle CPU: on a saturated host it refuses rather than report a figure
        assert "needs idle CPU" in ran.stderr
        assert not list(tmp_path.iterdir())
        return
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert f"bench: {name} exited 0 (host: " in ran.stderr
    written = records(name, tmp_path)
    if not written:  # a bench that replays recorded evidence and prints (rejudge, guard_replay)
        assert not list(tmp_path.glob("*.json*")), sorted(p.name for p in tmp_path.iterdir())
        return
    last = written[-1]
    assert last["quick"] is True
    assert 0.0 <= last["host"]["idle_share"] <= 1.0
    assert last["host"]["cpus"] == os.cpu_count()
    assert last["command"].startswith(f"python -m bench.{name}")
    page = (tmp_path / f"{name}.md").read_text()
    assert table(written) in page


def test_no_record_writes_nothing(tmp_path: Path) -> None:
    ran = _bench("run", "cli_startup", "--quick", "--no-record", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    assert list(tmp_path.iterdir()) == []
    assert "not recorded" in ran.stderr


def test_the_table_is_regenerated_and_notes_around_it_are_kept(tmp_path: Path) -> None:
    (tmp_path / "cli_startup.md").write_text("# cli_startup\n\nA note on the method.\n")
    counts = []
    for _ in range(2):
        ran = _bench("run", "cli_startup", "--quick", "--out", str(tmp_path))
        assert ran.returncode == 0, ran.stderr
        counts.append(len(records("cli_startup", tmp_path)))
    page = (tmp_path / "cli_startup.md").read_text()
    assert page.startswith("# cli_startup\n\nA note on the method.\n")
    assert page.count("<!-- records: end -->") == 1
    assert counts[0] > 0  # a record per command line it timed
    assert counts[1] == 2 * counts[0]
    # every figure in the table is one the records hold
    for entry in records("cli_startup", tmp_path):
        assert entry["figures"]
        for value in entry["figures"].values():
            assert str(value) in page or f"{value:.4g}" in page
    json.loads((tmp_path / "cli_startup.json").read_text())


def test_what_a_run_left_running_is_stopped_even_in_a_session_of_its_own() -> None:
    """PostgreSQL's postmaster leaves the bench's process group (pg_ctl starts it in a session
    of its own): the run's mark in its environment finds it."""
    mark = uuid.uuid4().hex
    env = {**os.environ, harness.RUN_MARK: mark}
    group_leader = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    elsewhere = subprocess.Popen(["setsid", "sleep", "300"], env=env)
    try:
        deadline = time.monotonic() + 10
        while len(harness._marked(mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(harness._marked(mark)) == 2
        stopped = harness.clean_up(mark, group_leader.pid, grace_s=5)
        # the group went first; the sweep found the one in a session of its own
        assert group_leader.wait(timeout=10) == -signal.SIGTERM
        assert len(stopped) == 1
        elsewhere.wait(timeout=10)
        assert harness._marked(mark) == []
    finally:
        for process in (group_leader, elsewhere):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_an_interrupted_run_stops_its_bench(tmp_path: Path) -> None:
    """SIGTERM to the harness mid-run: the bench unwinds and nothing of it stays."""
    harness_run = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", "soak", "--out", str(tmp_path), "--", "--once"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        child: int | None = None
        while child is None and time.monotonic() < deadline:
            time.sleep(0.5)
            child = next(
                (
                    pid
                    for pid in _pids()
                    if "bench.soak" in _cmdline(pid) and _parent(pid) == harness_run.pid
                ),
                None,
            )
        assert child is not None, "the soak did not start"
        time.sleep(5)
        harness_run.send_signal(signal.SIGTERM)
        _, err = harness_run.communicate(timeout=180)
        assert harness_run.returncode == 128 + signal.SIGTERM, err
        assert "exited 143" in err
        assert not Path(f"/proc/{child}").exists()
        assert not [pid for pid in _pids() if str(tmp_path) in _environ(pid)]
    finally:
        if harness_run.poll() is None:
            harness_run.kill()
            harness_run.wait()


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _read(path: str) -> str:
    try:
        return Path(path).read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline")


def _environ(pid: int) -> str:
    return _read(f"/proc/{pid}/environ")


def _parent(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat")
    return int(stat.rpartition(")")[2].split()[1]) if stat else -1
