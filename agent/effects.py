"""The one place the agent touches the system: sysfs writes and subprocesses.

With dry_run set, writes are logged and recorded but not made; read-only commands still run.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


class SysfsWriteError(OSError):
    """The kernel refused a write (EINVAL, EBUSY, …); errno and path say which."""


@dataclass
class Effects:
    dry_run: bool = False
    writes: list[tuple[Path, str]] = field(default_factory=list)

    def write_attribute(self, path: Path, value: str) -> None:
        """One write(2) of the whole value, as `echo value > path` does."""
        self.writes.append((path, value))
        if self.dry_run:
            log.info("dry run: would write %r to %s", value, path)
            return
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as error:
            raise SysfsWriteError(error.errno, f"cannot open {path}: {error.strerror}") from error
        try:
            os.write(fd, value.encode())
        except OSError as error:
            name = errno.errorcode.get(error.errno or 0, str(error.errno))
            raise SysfsWriteError(
                error.errno, f"kernel refused {value!r} for {path} ({name}: {error.strerror})"
            ) from error
        finally:
            os.close(fd)

    def run(self, *argv: str, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
        """A command (blkid, ipmitool, fio, db_bench): benchmarks write only to checked scratch."""
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
