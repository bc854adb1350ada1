"""Where the agent looks: every /sys, /proc and /dev path comes from a configurable root,
so tests point the agent at fixture trees of real files for hardware this machine lacks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostPaths:
    sys: Path = Path("/sys")
    proc: Path = Path("/proc")
    dev: Path = Path("/dev")
    run: Path = Path("/run")
    etc: Path = Path("/etc")  # udev rules and the TuneD profile an administrator set
    lib: Path = Path("/usr/lib")  # the distribution's udev rules and TuneD profiles

    @classmethod
    def under(cls, root: Path) -> HostPaths:
        """A fixture tree with sys/, proc/, dev/, run/, etc/ and usr/lib/ below one directory."""
        return cls(
            sys=root / "sys",
            proc=root / "proc",
            dev=root / "dev",
            run=root / "run",
            etc=root / "etc",
            lib=root / "usr" / "lib",
        )

    @property
    def locks(self) -> Path:
        """The host's locks on its devices (one per block device, and one for changes): under
        /run/lock, so that every blkpilot process on the host shares them, whatever its state
        directory — a canary run by hand beside the daemon waits for the daemon's."""
        return self.run / "lock" / "blkpilot"

    @property
    def block(self) -> Path:
        return self.sys / "block"

    def queue(self, device: str) -> Path:
        return self.block / device / "queue"

    def kernel_release(self) -> str:
        return read_text(self.proc / "sys" / "kernel" / "osrelease") or os.uname().release


def read_text(path: Path) -> str | None:
    """The file's content without the trailing newline; None if it cannot be read."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
