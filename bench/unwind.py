"""A benchmark stopped by a signal unwinds as one interrupted with Ctrl-C does.

Python's default for SIGTERM and SIGHUP ends the process at once: no `finally` runs, so a
benchmark stopped by `kill` (the only way to stop one started in the background, where SIGINT
is ignored), a CI job's timeout or a closed terminal left behind what it had
started — `serve` replicas, the embedded PostgreSQL and its data directory (hundreds of MB a
run of bench.ingest), mounted loop devices, the applications under test. With these handlers
the signal raises SystemExit(128 + signal) wherever the benchmark is, and its `finally` blocks
stop and remove what it made (tests/test_bench_unwind.py stops bench.ingest mid-run).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


def _exit(signum: int, _frame: FrameType | None) -> None:
    sys.exit(128 + signum)


def on_termination() -> None:
    """SIGTERM and SIGHUP unwind the benchmark (call first thing in its main)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)
