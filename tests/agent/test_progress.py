"""Progress lines of the long steps: on stderr from the command line, nowhere from a library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent import progress


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def test_a_library_caller_sees_progress_only_where_its_logging_shows_info() -> None:
    quiet = python(
        "import logging; logging.basicConfig(level=logging.WARNING)\n"
        "from agent.progress import note\n"
        "note('training %d of %d', 1, 2)\n"
    )
    assert quiet.stdout == ""
    assert quiet.stderr == "", quiet.stderr
    daemon = python(
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from agent.progress import note\n"
        "note('training %d of %d', 1, 2)\n"
    )
    assert daemon.stderr == "INFO:blkpilot.progress:training 1 of 2\n"


def test_the_command_line_shows_progress_once_with_the_seconds_elapsed() -> None:
    done = python(
        "from agent.progress import note, show_on_stderr\n"
        "show_on_stderr(); show_on_stderr()\n"
        "note('training %d of %d', 1, 2)\n"
        "print('the answer')\n"
    )
    assert done.stdout == "the answer\n"  # stdout stays the command's own (JSON included)
    assert done.stderr.splitlines() == ["blkpilot [    0 s] training 1 of 2"], done.stderr


def test_every_is_due_at_most_once_per_period(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 5.0, 10.0, 10.5, 25.0])
    monkeypatch.setattr("agent.progress.time.monotonic", lambda: next(clock))
    every = progress.Every(10.0)  # made at 0
    assert [every.due() for _ in range(4)] == [False, True, False, True]
