"""The soak's short version: each kind of fault once (PostgreSQL restarted during ingest, the
service restarted mid-rollout, an agent killed during an apply), three agents, real processes.
The full twenty minutes: `python -m bench.soak` (bench/results/soak.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_faults_lose_no_window_and_leave_every_apply_finished_or_restored() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--seconds", "60", "--once", "--no-record"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    start = done.stdout.index('{\n  "benchmark": "soak"')
    result = json.loads(done.stdout[start : done.stdout.rindex("}") + 1])
    assert result["windows_lost"] == 0
    assert result["windows_duplicated"] == 0
    assert result["windows_stored"] > 3 * 50  # three agents, a window a second
    assert result["applies_finished_or_restored"] is True
    assert result["server_errors_outside_restarts"] == 0
    faults = [event["fault"] for event in result["events"]]
    assert faults == [
        "database restarted",
        "service restarted mid-rollout",
        "agent killed during an apply",
    ]
    assert all(h["journal_left"] is False for h in result["hosts"].values())
