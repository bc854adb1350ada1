"""Signals during a change: SIGTERM, SIGINT and SIGHUP become an exception where the change is
being made, so that the code making it restores what was there before the process exits.

Without this, SIGTERM and SIGHUP end Python at once: a live canary stopped by `systemctl stop`
or a closed terminal left its candidate applied. A second signal while the restore runs is
logged and ignored — the restore is what the first one asked for. A kill -9 cannot be caught:
the applier's journal restores that change at the agent's next start.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

log = logging.getLogger(__name__)

RESTORING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(BaseException):
    """A signal arrived during a change. A BaseException, so that no `except Exception`
    swallows it before the code that made the change has restored it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_status(self) -> int:
        """The shell's status for a process ended by the signal (143 for SIGTERM)."""
        return 128 + self.signum


@contextmanager
def restoring_on_signals() -> Iterator[None]:
    """Inside: the first SIGTERM, SIGINT or SIGHUP raises Interrupted; later ones are
    ignored while the caller restores. Outside the main thread this does nothing (Python
    delivers signals to the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if raised:
            log.warning(
                "%s while restoring after %s: ignored, the restore goes on",
                signal.Signals(signum).name,
                signal.Signals(raised[0]).name,
            )
            return
        raised.append(signum)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in RESTORING_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
