"""One harness for every benchmark: `python -m bench list` names them, `python -m bench run
NAME` runs one.

What every bench needs and used to do its own way lives here: where its records go (`--out`,
never the checkout when given), `--no-record`, a quick mode that always works, the host's load
and idle time beside every figure (bench.record), and cleaning up what a bench started when it
fails or is interrupted — its process group, and every process that inherited the run's mark
even where it left the group (PostgreSQL's postmaster: pg_ctl starts it in a session of its
own). A bench keeps only its own measurement.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from bench.record import NO_RECORD_ENV, OUT_ENV, QUICK_ENV, ROOT, CpuTimes, host_load

# every process a run starts carries this in its environment, whatever session it moves to
RUN_MARK = "BLKPILOT_BENCH_RUN"


@dataclass(frozen=True)
class Bench:
    """A benchmark: `module` runs it (python -m); `quick` are the arguments of its quick mode
    (a look, never recorded as the figure); `takes` how long a full run takes on the 2-core
    reference host, `quick_takes` the quick mode; `needs` what it must have beyond the
    project's own set-up; `suite` the test that runs its quick mode in `make test` when it is
    too long for tests/test_bench_harness.py (a boot of the kernel lab, a real application)."""

    name: str
    what: str
    takes: str
    quick: tuple[str, ...]
    quick_takes: str
    needs: str = ""
    suite: str = ""

    @property
    def module(self) -> str:
        return f"bench.{self.name}"


LAB = "the kernel lab (QEMU, Debian 6.1 guest)"
ROOT_LOOP = "root: loop devices"

BENCHES: dict[str, Bench] = {
    b.name: b
    for b in (
        Bench(
            "agent_footprint",
            "CPU and resident memory of `blkpilot agent run` with 16 devices",
            "2 min",
            ("--devices", "4", "--warmup", "2", "--seconds", "6"),
            "40 s",
            ROOT_LOOP,
        ),
        Bench(
            "bpf_cost",
            "host CPU the eBPF latency collector adds per I/O (target ≤ 300 ns); needs idle CPU",
            "3 min",
            ("--rounds", "3", "--seconds", "1", "--settle", "0.5"),
            "20 s",
            "root: eBPF, loop devices",
        ),
        Bench(
            "canary",
            "synthetic canary quality: A/A false fails, bfq's cost caught, a good change kept",
            "25 min",
            ("--canaries", "1", "--rounds", "3", "--max-rounds", "3", "--round-seconds", "0.3"),
            "1 min",
            ROOT_LOOP,
        ),
        Bench(
            "cli_startup",
            "how long `blkpilot --help` and a subcommand's --help take (CPU seconds)",
            "30 s",
            ("--runs", "2"),
            "10 s",
        ),
        Bench(
            "fleet",
            "a simulated fleet (10,000 nodes x 16 devices) against real `serve` replicas",
            "15 min",
            ("--nodes", "50", "--devices", "2", "--intervals", "1", "--reads", "3"),
            "1 min",
            "PostgreSQL (embedded)",
        ),
        Bench(
            "fleet_gaps",
            "the schedulers' gaps on the fleet tests' loop devices (which workload tells them)",
            "6 min",
            ("--rounds", "2", "--seconds", "0.3"),
            "1 min",
            ROOT_LOOP,
        ),
        Bench(
            "guard_replay",
            "the live canary's guard replayed on recorded canaries' evidence",
            "10 s",
            ("--latest", "1"),
            "10 s",
        ),
        Bench(
            "hostile",
            "the hostile probe: bad input, authorisation, a database outage, concurrent edits",
            "25 min",
            ("--quick",),
            "6 min",
            "PostgreSQL (embedded)",
            suite="tests/service/test_hardening.py",
        ),
        Bench(
            "ingest",
            "telemetry ingest: windows per second and CPU per window, service and database",
            "5 min",
            ("--clients", "2", "--batches", "4", "--windows", "50", "--warmup", "1"),
            "1 min",
            "PostgreSQL (embedded)",
        ),
        Bench(
            "ingest_statement",
            "the database's own cost per window of each way to store a batch",
            "5 min",
            ("--batches", "4", "--windows", "50", "--rounds", "1"),
            "1 min",
            "PostgreSQL (embedded)",
            suite="tests/service/test_ingest_statement.py",
        ),
        Bench(
            "lab_energy",
            "polling or interrupts, for energy, on the lab's devices",
            "15 min",
            ("--rounds", "1", "--seconds", "1"),
            "5 min",
            LAB,
            suite="tests/kernel/test_lab.py",
        ),
        Bench(
            "lab_fios_efficiency",
            "FIOS' concurrent efficiency and fairness against mq-deadline, run by run",
            "60 min",
            ("--cpus", "2", "--rounds", "1", "--seconds", "2", "--cases", "1r7w"),
            "5 min",
            LAB,
            suite="tests/kernel/test_lab.py",
        ),
        Bench(
            "lab_fios_pause",
            "deceptive idleness: a reader that pauses, across boots",
            "20 min",
            ("--boots", "1", "--seconds", "2"),
            "4 min",
            LAB,
            suite="tests/kernel/test_lab.py",
        ),
        Bench(
            "lab_fios_review",
            "FIOS for a kernel reviewer: switches under load, unload cycles, fairness cases",
            "25 min",
            ("--seconds", "2"),
            "8 min",
            LAB,
            suite="tests/kernel/test_lab.py",
        ),
        Bench(
            "lab_fios_rocksdb",
            "RocksDB's db_bench against writers under each scheduler",
            "20 min",
            ("--boots", "1", "--seconds", "2"),
            "5 min",
            LAB,
            suite="tests/kernel/test_lab.py",
        ),
        Bench(
            "lab_flash",
            "fairness and polling on the flash-like device (flashsim)",
            "15 min",
            ("--seconds", "1"),
            "5 min",
            LAB,
            suite="tests/kernel/test_lab.py",
        ),
        Bench(
            "lab_hooks",
            "each scheduler hook's own cost per request",
            "10 min",
            ("--rounds", "1", "--seconds", "1"),
            "3 min",
            LAB,
            suite="tests/kernel/test_lab.py",
        ),
        Bench(
            "lab_overhead",
            "scheduler overhead on null_blk, 4 KB QD1",
            "10 min",
            ("--rounds", "1", "--seconds", "1"),
            "3 min",
            LAB,
            suite="tests/kernel/test_lab.py",
        ),
        Bench(
            "live_apps",
            "the live canary judged on PostgreSQL, RocksDB, Redis and MariaDB",
            "6 h",
            ("--aa", "1", "--regressions", "0", "--apps", "pgbench"),
            "6 min",
            "root: loop devices, eBPF; the applications (make test installs them)",
            suite="tests/agent/test_live_apps.py",
        ),
        Bench(
            "live_canary",
            "live canary quality on devices holding data: A/A false fails, regressions caught",
            "40 min",
            ("--aa", "1", "--regressions", "0"),
            "3 min",
            "root: loop devices, eBPF",
            suite="tests/agent/test_live_canary.py",
        ),
        Bench(
            "partitions",
            "telemetry partition maintenance: time to create, roll up and drop",
            "3 min",
            ("--devices", "4", "--repeats", "1", "--size", "hour"),
            "1 min",
            "PostgreSQL (embedded)",
            suite="tests/service/test_telemetry_retention.py",
        ),
        Bench(
            "policy_eval",
            "decision quality: regret of the pick against the oracle and the fixed rules",
            "40 min",
            (
                "--holdout",
                "device",
                "--no-ray",
                "--objective",
                "p50_latency",
                "--device",
                "host-loop-tmpfs",
                "--device",
                "host-loop-disk",
                "--device",
                "lab-nullblk",
                "--no-refit",
                "--max-canaries",
                "1",
            ),
            "2 min",
        ),
        Bench(
            "policy_grid",
            "the measured grid policy_eval judges on (every candidate on every device)",
            "3 h",
            (
                "--host",
                "--repeats",
                "1",
                "--seconds",
                "0.2",
                "--device",
                "host-loop-tmpfs",
                "--workload",
                "hs23-single-randread-4k-qd1",
            ),
            "1 min",
            ROOT_LOOP,
        ),
        Bench(
            "rejudge",
            "the live judge tried again on recorded canaries' evidence",
            "1 min",
            ("--latest", "1"),
            "1 min",
        ),
        Bench(
            "soak",
            "a service and three agents under injected faults for 20 minutes",
            "20 min",
            ("--seconds", "60", "--once"),
            "3 min",
            "PostgreSQL (embedded); root: loop devices",
            suite="tests/test_soak.py",
        ),
    )
}


def listing() -> str:
    """`python -m bench list`: a line per bench — what it measures, how long it and its quick
    mode take, what it needs."""
    width = max(len(name) for name in BENCHES)
    lines = []
    for bench in BENCHES.values():
        needs = f"; needs {bench.needs}" if bench.needs else ""
        lines.append(
            f"{bench.name:<{width}}  {bench.what} ({bench.takes}, --quick {bench.quick_takes}"
            f"{needs})"
        )
    return "\n".join(lines)


def _marked(run: str) -> list[int]:
    """Processes that carry this run's mark in their environment (readable as root, or as
    their owner)."""
    needle = f"{RUN_MARK}={run}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def clean_up(run: str, group: int, grace_s: float = 30.0) -> list[int]:
    """Stop what a run left behind. The bench's process group first (SIGTERM: its own
    `finally` blocks stop what it started, bench.unwind), then every process still carrying
    the run's mark (SIGTERM, SIGKILL after grace_s). Returns the pids the sweep found."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(group):
        time.sleep(0.2)
    left = _marked(run)
    for pid in left:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _marked(run):
        time.sleep(0.2)
    for pid in _marked(run):
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def run(
    name: str,
    args: Sequence[str] = (),
    *,
    quick: bool = False,
    out: Path | None = None,
    record: bool = True,
) -> int:
    """Run one bench (its quick mode with quick), its records to out (bench/results when
    None); its exit status. Interrupted (SIGINT, SIGTERM, SIGHUP) or failed, whatever it
    started is stopped before this returns."""
    bench = BENCHES[name]
    if out is not None:
        out = out.resolve()
        out.mkdir(parents=True, exist_ok=True)
    mark = uuid.uuid4().hex
    began = CpuTimes.now()
    env = {
        **os.environ,
        RUN_MARK: mark,
        "BLKPILOT_BENCH_CPU0": f"{began.total} {began.idle}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if out is not None:
        env[OUT_ENV] = str(out)
    if not record:
        env[NO_RECORD_ENV] = "1"
    if quick:
        env[QUICK_ENV] = "1"
    command = [sys.executable, "-m", bench.module, *(bench.quick if quick else ()), *args]
    print(f"bench: {' '.join(command[2:])}", file=sys.stderr, flush=True)
    process = subprocess.Popen(command, env=env, cwd=ROOT, start_new_session=True)
    stopped = _stop_on_signals()
    try:
        code = process.wait()
    except _Stopped as signalled:
        code = 128 + signalled.signum
    finally:
        stopped()
        left = clean_up(mark, process.pid)
        if process.poll() is None:
            process.kill()
        process.wait()
    if left:
        print(f"bench: stopped {len(left)} process(es) {name} left running", file=sys.stderr)
    host = host_load(began)
    idle = "" if host["idle_share"] is None else f", {host['idle_share']:.0%} idle"
    print(
        f"bench: {name} exited {code} (host: {host['cpus']} CPUs, load {host['load1']}{idle}"
        f"{', busy' if host['busy'] else ''})",
        file=sys.stderr,
    )
    return code


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_on_signals() -> Callable[[], None]:
    """SIGINT, SIGTERM and SIGHUP end the wait for the bench (which is then cleaned up);
    returns what puts the previous handlers back."""

    def handler(signum: int, _frame: object) -> None:
        raise _Stopped(signum)

    previous = {
        s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
