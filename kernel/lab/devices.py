"""Lab block devices on this host: loop devices with direct I/O on a tmpfs file (memory speed,
ULL-like) or on a file on disk (SSD-like). They are created empty; nothing else ever lives on
them. The scheduler reset goes through the agent's `Effects`, like every sysfs write."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.effects import Effects

TMPFS = Path("/dev/shm")  # noqa: S108 (a tmpfs, by design)
DEFAULT_SCHEDULER = "none"  # what the kernel gives a new loop device


class LabError(RuntimeError):
    pass


def _losetup(*args: str) -> str:
    result = subprocess.run(
        ["losetup", *args], capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        raise LabError(f"losetup {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def attach(backing: Path, size_bytes: int, *, direct_io: bool = True) -> str:
    """Create a zeroed sparse backing file and attach it; returns the device name (loopN)."""
    if backing.exists():
        raise LabError(f"{backing} exists; lab devices start from an empty file")
    backing.parent.mkdir(parents=True, exist_ok=True)
    with backing.open("wb") as handle:
        handle.truncate(size_bytes)
    try:
        path = _losetup(
            "--find", "--show", f"--direct-io={'on' if direct_io else 'off'}", str(backing)
        )
    except LabError:
        backing.unlink()
        raise
    name = os.path.basename(path)
    # Loop devices are reused and keep their queue settings across attachments: start clean.
    Effects().write_attribute(Path(f"/sys/block/{name}/queue/scheduler"), DEFAULT_SCHEDULER)
    return name


def detach(name: str, backing: Path | None = None) -> None:
    _losetup("--detach", f"/dev/{name}")
    if backing is not None:
        backing.unlink(missing_ok=True)


def release_stale(backing: Path) -> None:
    """Detach whatever a previous, crashed run left attached to this backing file."""
    if not backing.exists():
        return
    for line in _losetup("--associated", str(backing)).splitlines():
        device = line.split(":", 1)[0]
        _losetup("--detach", device)
    backing.unlink()


@contextmanager
def lab_devices(specs: dict[str, tuple[Path, int]]) -> Iterator[dict[str, str]]:
    """Attach a loop device per (backing file, size); detach and delete them on exit."""
    attached: dict[str, tuple[str, Path]] = {}
    try:
        for label, (backing, size) in specs.items():
            release_stale(backing)
            attached[label] = (attach(backing, size), backing)
        yield {label: name for label, (name, _) in attached.items()}
    finally:
        for name, backing in attached.values():
            detach(name, backing)
