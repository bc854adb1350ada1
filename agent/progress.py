"""Progress of the long steps — benchmarks, canaries, training — one line each on stderr.

A step that takes minutes says what it is doing while it does it, so that whoever waits (an
operator at a terminal, the demo's log, a CI job) can tell a slow step from a stuck one:

    blkpilot [  41 s] live canary on vdb: 20 pairs judged (1 set aside); first look at 40

The lines go through the `blkpilot.progress` logger: the command line shows them on stderr
(`show_on_stderr`, once per process; stdout stays the command's answer, JSON included); a
daemon or library caller sees them where its logging shows INFO (they propagate to its
handlers until the command line takes them), and not at Python's default level, WARNING.
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER = "blkpilot.progress"
log = logging.getLogger(LOGGER)
_STARTED = time.time()  # the records' own clock (LogRecord.created)


class _Elapsed(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"blkpilot [{record.created - _STARTED:5.0f} s] {record.getMessage()}"


def note(message: str, *args: object) -> None:
    """One line of progress (printf-style arguments, formatted only if it is shown)."""
    log.info(message, *args)


def show_on_stderr() -> None:
    """Show progress lines on stderr, with the seconds since this process began; once."""
    if any(getattr(h, "_blkpilot_progress", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Elapsed())
    handler._blkpilot_progress = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


class Every:
    """True at most once per `seconds`: a loop that turns fast says where it is now and then."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._last = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True
