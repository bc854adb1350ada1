"""The live canary judged on real applications nobody here wrote: PostgreSQL under pgbench (ext4
on a disk-backed loop device, the SLI ms per WAL sync from prometheus-postgres-exporter) and
RocksDB under db_bench readrandom with direct reads (ext4 on a tmpfs loop device).

For every canary run, each candidate's true effect is measured first with the application's
own metric, outside the canary: the application alone for `--effect-seconds` under the
baseline, the candidate, the baseline again (pgbench's average latency, db_bench's p50); then
`blkpilot agent canary --mode live` judges it on the application's traffic. Recorded per
application and candidate: the verdicts, the time to each verdict, the true effects, and the
passes of a candidate whose application metric was worse than its tolerance (never allowed).

    python -m bench.live_apps                      # 20 A/A and 10 of each regression, quiet
    python -m bench.live_apps --hog                # the same beside a CPU hog on one core
    python -m bench.live_apps --aa 2 --regressions 1 --no-record   # a look
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.record import out_dir, provenance, record, recording
from bench.unwind import on_termination
from kernel.lab.devices import TMPFS, DataDevice, data_device
from tests.apps import (
    _pg_bin,
    mariadb_on,
    mariadb_sli,
    mysqld_exporter,
    pgbench,
    postgres_exporter,
    postgres_on,
    redis_on,
    rocksdb_on,
)

BLKPILOT = str(Path(sys.executable).parent / "blkpilot")
# evidence files go where the records go (bench/results unless --out)
EVIDENCE = out_dir() / "live_apps_evidence"
TOLERANCE = 0.10  # the application metric this much worse is a regression a pass must not hide
VERDICTS = {0: "pass", 1: "fail", 3: "inconclusive", 4: "could not run"}


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


@dataclass(frozen=True)
class Candidate:
    name: str
    args: tuple[str, ...]  # `agent canary` options naming it
    sysfs: dict[str, str]  # what it writes under queue/, for the true-effect runs


NONE = Candidate(
    "A/A (none)", ("--scheduler", "none"), {"scheduler": "none", "read_ahead_kb": "128"}
)
BFQ = Candidate("bfq", ("--scheduler", "bfq"), {"scheduler": "bfq"})
BFQ_IDLE = Candidate(
    "bfq slice_idle 100 ms, strict",
    ("--scheduler", "bfq", "--tunable", "slice_idle_us=100000", "--tunable",
     "strict_guarantees=1"),
    {"scheduler": "bfq", "iosched/slice_idle_us": "100000", "iosched/strict_guarantees": "1"},
)  # fmt: skip
DEPTH_ONE = Candidate(
    "mq-deadline async_depth 1, fifo_batch 1",
    ("--scheduler", "mq-deadline", "--tunable", "async_depth=1", "--tunable", "fifo_batch=1"),
    {"scheduler": "mq-deadline", "iosched/async_depth": "1", "iosched/fifo_batch": "1"},
)


@dataclass
class Run:
    app: str
    candidate: str
    verdict: str
    seconds: float
    effect: float  # relative change of the application's metric (positive: worse)
    notes: str = ""
    evidence: Any = field(default=None, repr=False)  # the canary's --evidence


@dataclass
class App:
    name: str
    device: DataDevice
    metric: str  # what `effect` is, for people
    traffic: Callable[[], contextlib.AbstractContextManager[Any]]
    measure: Callable[[float], float]  # the application alone for that long: its metric
    canary_args: tuple[str, ...] = ()
    candidates: list[Candidate] = field(default_factory=list)


def set_queue(device: str, values: dict[str, str]) -> None:
    queue = Path(f"/sys/block/{device}/queue")
    for attribute, value in values.items():  # scheduler first: switching resets its tunables
        (queue / attribute).write_text(value)


class AppFailed(Exception):
    """The application's own run ended in error (pgbench exit 2: a client aborted)."""


def true_effect(app: App, candidate: Candidate, seconds: float, rounds: int) -> float:
    """The candidate's effect on the application's own metric: baseline and candidate in
    turn, `rounds` times each in A B B A order (a steady trend cancels), the median of each —
    this host's speed drifts by a third within a minute (db_bench: 36k and 76k I/Os per
    second), and one A B A turn read an unchanged configuration as 35 % better. An application
    that fails under the candidate is infinitely worse (+inf; pgbench's clients aborted under
    bfq with 100 ms idling, 2026-11-26); one that fails under the baseline measured nothing
    (NaN): both said in the log, neither stops the run."""
    measured: dict[str, list[float]] = {"A": [], "B": []}
    try:
        for turn in range(rounds):
            order = (("A", NONE.sysfs), ("B", candidate.sysfs))
            for arm, values in order if turn % 2 == 0 else order[::-1]:
                set_queue(app.device.name, values)
                try:
                    measured[arm].append(app.measure(seconds))
                except AppFailed as error:
                    under = "the candidate" if arm == "B" else "the baseline"
                    log(f"{app.name} failed under {under}: {error}")
                    return math.inf if arm == "B" else math.nan
    finally:
        set_queue(app.device.name, NONE.sysfs)
    return statistics.median(measured["B"]) / statistics.median(measured["A"]) - 1


def canary(app: App, candidate: Candidate, state: Path) -> tuple[str, float, str, Any]:
    """The verdict, the seconds to it, what it said, and its evidence (`--evidence`: what
    the judge saw, to judge again) where it wrote one."""
    started = time.monotonic()
    evidence = state / "evidence.json"
    evidence.unlink(missing_ok=True)
    with app.traffic():
        done = subprocess.run(
            [BLKPILOT, "agent", "canary", app.device.name, "--mode", "live", *candidate.args,
             *app.canary_args, "--no-report", "--state-dir", str(state),
             "--evidence", str(evidence)],
            capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
    seconds = time.monotonic() - started
    set_queue(app.device.name, NONE.sysfs)  # a pass keeps the candidate: back to the baseline
    verdict = VERDICTS.get(done.returncode, f"exit {done.returncode}")
    notes = " ".join(line for line in done.stdout.splitlines() if line.startswith("note:"))
    # each metric's shift and verdict first (which one failed or held a verdict back)
    shifts = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            shifts.append(f"{row['metric']} {row['shift_%']:+.1f} % {row['verdict']}")
    notes = "; ".join(shifts) + ("; " if shifts and notes else "") + notes
    if verdict.startswith("exit") or verdict == "could not run":
        notes += done.stderr[-300:]
    return verdict, seconds, notes, json.loads(evidence.read_text()) if evidence.exists() else None


def save_evidence(path: Path, runs: list[Run]) -> None:
    """Every run's verdict with its canary's evidence, gzipped: a judge can be tried again on
    exactly these canaries (bench.rejudge)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in r.__dict__.items()} for r in runs]
    with gzip.open(path.with_suffix(".tmp"), "wt") as out:
        json.dump(rows, out)
    path.with_suffix(".tmp").replace(path)


# --- the applications -----------------------------------------------------------------------


@contextlib.contextmanager
def postgres_app(base: Path) -> Iterator[App]:
    with data_device(base / "pg.img", 2 << 30, base / "pg", data_bytes=16 << 20) as device:
        (base / "pg").chmod(0o755)
        with postgres_on(base / "pg") as database:
            subprocess.run([_pg_bin("pgbench"), "-i", "-q", "-s", "10", database.uri],
                           capture_output=True, check=True, timeout=600)  # fmt: skip

            def measure(seconds: float) -> float:
                done = subprocess.run(
                    [_pg_bin("pgbench"), "-n", "-c", "4", "-j", "2", "-T", f"{seconds:.0f}",
                     database.uri],
                    capture_output=True, text=True, timeout=seconds + 120, check=False,
                )  # fmt: skip
                if done.returncode != 0:
                    raise AppFailed(f"pgbench exit {done.returncode}: {done.stderr[-300:]!r}")
                found = re.search(r"latency average = ([\d.]+) ms", done.stdout)
                assert found, done.stdout
                return float(found.group(1))

            @contextlib.contextmanager
            def traffic() -> Iterator[None]:
                with pgbench(database, clients=4, scale=10, initialise=False):
                    yield

            with postgres_exporter(database, base) as url:
                sli = base / "sli.json"
                sli.write_text(json.dumps({
                    "url": url, "kind": "ratio", "metric": "pg_stat_wal_wal_sync_time",
                    "per": "pg_stat_wal_wal_sync", "description": "ms per WAL sync",
                }))  # fmt: skip
                yield App(
                    "pgbench",
                    device,
                    "pgbench latency average (ms)",
                    traffic,
                    measure,
                    ("--sli-file", str(sli)),
                    [NONE, BFQ_IDLE, DEPTH_ONE],
                )


@contextlib.contextmanager
def rocksdb_app(base: Path) -> Iterator[App]:
    backing = TMPFS / f"blkpilot-live-apps-{base.name}.img"
    with (
        data_device(backing, 2 << 30, base / "rocks", data_bytes=16 << 20) as device,
        rocksdb_on(base / "rocks") as database,
    ):
        yield App("db_bench", device, "db_bench readrandom p50 (us)", database.traffic,
                  database.p50_us, (), [NONE, BFQ])  # fmt: skip


# a change these applications do not feel by construction: they read with O_DIRECT (InnoDB)
# or not at all (Redis), so the page cache's read-ahead never runs for them
READ_AHEAD = Candidate("read_ahead 4 MiB", ("--read-ahead-kb", "4096"), {"read_ahead_kb": "4096"})


@contextlib.contextmanager
def mariadb_app(base: Path) -> Iterator[App]:
    """MariaDB's InnoDB (16 KiB pages, a redo log, the doublewrite buffer; a buffer pool an
    eighth of its tables) on ext4 on a disk-backed loop device, under sysbench's read-write
    load paced at 100 transactions a second from 4 threads — the third database of issue 65,
    open-loop. Its own metric: sysbench's p99 latency (ms). The canary judges it by its SLI,
    every query's mean time from MariaDB's query_response_time plugin, which decides
    (mariadb_sli): its block-level p99 swings too much per interval to pass at 10 %."""
    with (
        data_device(base / "maria.img", 2 << 30, base / "maria", data_bytes=16 << 20) as device,
        mariadb_on(base / "maria") as database,
        mysqld_exporter(database, base) as url,
    ):

        def measure(seconds: float) -> float:
            try:
                return database.run(seconds)[0]
            except RuntimeError as error:
                raise AppFailed(str(error)) from error

        sli = base / "maria-sli.json"
        sli.write_text(mariadb_sli(url).model_dump_json())
        yield App("mariadb", device, "sysbench oltp_read_write p99 (ms)", database.traffic,
                  measure, ("--sli-file", str(sli)), [NONE, BFQ_IDLE, READ_AHEAD])  # fmt: skip


@contextlib.contextmanager
def redis_app(base: Path) -> Iterator[App]:
    """Redis appending every SET to its append-only file with an fsync (appendfsync always),
    on ext4 on a disk-backed loop device, under redis-benchmark's four clients, while a backup
    reads the volume's data file (direct, 128 KiB at a time) — a key-value store with an
    append-only log beside a batch reader, closed-loop. Its own metric: redis-benchmark's p99
    latency (ms). bfq idling 100 ms on each queue takes it from ~3.5 ms to 100-150 ms here."""
    with (
        data_device(base / "redis.img", 1 << 30, base / "redis", data_bytes=256 << 20) as device,
        redis_on(base / "redis", backup=device.data_file) as server,
    ):

        def measure(seconds: float) -> float:
            try:
                return server.run(seconds)[0]
            except RuntimeError as error:
                raise AppFailed(str(error)) from error

        yield App("redis", device, "redis-benchmark SET p99 (ms)", server.traffic, measure,
                  (), [NONE, BFQ_IDLE, READ_AHEAD])  # fmt: skip


APPS = {"pgbench": postgres_app, "db_bench": rocksdb_app, "mariadb": mariadb_app,
        "redis": redis_app}  # fmt: skip


@contextlib.contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    hog = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def summarise(runs: list[Run]) -> list[dict[str, Any]]:
    rows = []
    for key in sorted({(r.app, r.candidate) for r in runs}):
        chosen = [r for r in runs if (r.app, r.candidate) == key]
        verdicts = [r.verdict for r in chosen]
        effects = [r.effect for r in chosen if not math.isnan(r.effect)]  # inf: the app failed
        finite = [e for e in effects if math.isfinite(e)]
        rows.append(
            {
                "app": key[0],
                "candidate": key[1],
                "runs": len(chosen),
                "pass": verdicts.count("pass"),
                "fail": verdicts.count("fail"),
                "inconclusive": verdicts.count("inconclusive"),
                "could_not_run": verdicts.count("could not run"),
                "median_effect_%": round(100 * statistics.median(effects), 1) if effects else None,
                # an A/A's true effect is zero by construction: what it measures is the
                # noise of the application's own metric on this host, not a regression
                "wrong_passes": None
                if key[1] == NONE.name
                else sum(r.verdict == "pass" and r.effect > TOLERANCE for r in chosen),
                "effect_spread_%": round(100 * statistics.pstdev(finite), 1) if finite else None,
                "application_failed": sum(r.effect == math.inf for r in chosen),
                "median_seconds": round(statistics.median(r.seconds for r in chosen), 1),
                "max_seconds": round(max(r.seconds for r in chosen), 1),
            }
        )
    return rows


@contextlib.contextmanager
def _removed(directory: Path) -> Iterator[None]:
    """The working directory removed however the run ends (a stopped run left it behind)."""
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aa", type=int, default=20, help="A/A canaries per application")
    parser.add_argument("--regressions", type=int, default=10, help="runs of each regression")
    parser.add_argument("--effect-seconds", type=float, default=5.0)
    parser.add_argument(
        "--effect-rounds", type=int, default=4, help="turns of baseline and candidate"
    )
    parser.add_argument("--hog", action="store_true", help="a CPU hog on core 0 throughout")
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument(
        "--effects-only",
        action="store_true",
        help="measure each candidate's true effect on each application, no canary",
    )
    parser.add_argument(
        "--candidate",
        action="append",
        help="only this candidate, by name (repeatable; default: each app's all)",
    )
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    # a stopped run still stops the applications and unmounts and detaches its devices
    on_termination()
    runs: list[Run] = []
    base = Path(tempfile.mkdtemp(prefix="blkpilot-live-apps-"))
    makers = APPS
    stamp = time.strftime("%Y%m%dT%H%MZ", time.gmtime())
    evidence_file = (
        EVIDENCE / f"{stamp}-{args.apps.replace(',', '+')}-{'hog' if args.hog else 'quiet'}.json.gz"
    )
    with cpu_hog(args.hog), _removed(base):
        for name in args.apps.split(","):
            (base / name).mkdir()
            with makers[name](base / name) as app:
                for candidate in app.candidates:
                    if args.candidate and candidate.name not in args.candidate:
                        continue
                    repeats = args.aa if candidate is NONE else args.regressions
                    for index in range(repeats):
                        effect = true_effect(
                            app, candidate, args.effect_seconds, args.effect_rounds
                        )
                        if args.effects_only:
                            log(
                                f"{app.name} {candidate.name}: {100 * effect:+.1f} % ({app.metric})"
                            )
                            continue
                        verdict, seconds, notes, evidence = canary(
                            app, candidate, base / name / "agent"
                        )
                        runs.append(
                            Run(app.name, candidate.name, verdict, seconds, effect, notes, evidence)
                        )
                        if recording() and not args.no_record:
                            save_evidence(evidence_file, runs)
                        log(
                            f"{app.name} {candidate.name} #{index + 1}: {verdict} in"
                            f" {seconds:.0f} s; true effect {100 * effect:+.1f} % ({app.metric})"
                            f"{'; ' + notes[:200] if notes else ''}"
                        )
    rows = summarise(runs)
    result: dict[str, Any] = {
        **provenance(__file__),
        "hog": args.hog,
        "summary": rows,
        "runs": [{k: v for k, v in r.__dict__.items() if k != "evidence"} for r in runs],
        "evidence": str(evidence_file.relative_to(EVIDENCE.parent)),
    }
    print(json.dumps(rows, indent=2))
    if recording() and not args.no_record:
        for row in rows:
            record(
                "live_apps",
                {**result, **row, "hog": "hog" if args.hog else "quiet"},
                {
                    "host": "hog",
                    "app": "app",
                    "candidate": "candidate",
                    "runs": "runs",
                    "pass": "pass",
                    "fail": "fail",
                    "inconclusive": "inconclusive",
                    "could not run": "could_not_run",
                    "true effect (median %)": "median_effect_%",
                    "true effect (sd %)": "effect_spread_%",
                    "passes of a >10 % regression": "wrong_passes",
                    "application failed": "application_failed",
                    "seconds (median / max)": "median_seconds",
                },
            )


if __name__ == "__main__":
    main()
