"""Where a benchmark runs, and whether it may write there.

A target is a block device or a directory on a filesystem. Writes go only to scratch: a device
that holds no data (no partitions, holders, mounts, swap or signatures), or files blkpilot
creates in a directory. Read-only workloads may run on devices that hold data: fio then runs
with --readonly, which refuses any write."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from agent import holders
from agent.contract.workloads import WorkloadSpec
from agent.effects import Effects
from agent.errors import BenchmarkRefused
from agent.host import HostPaths, read_int, read_text

SCRATCH_PREFIX = "blkpilot-bench"


@dataclass(frozen=True)
class BenchTarget:
    path: Path  # /dev/NAME, or a directory
    device: str | None  # the block device whose queue is tuned (for a directory: its fs's)
    is_directory: bool
    holds_data: bool
    reasons: list[str] = field(default_factory=list)
    size_bytes: int = 0

    @property
    def label(self) -> str:
        return str(self.path)


def device_target(paths: HostPaths, name: str, effects: Effects | None = None) -> BenchTarget:
    if not (paths.block / name / "queue").is_dir():
        raise BenchmarkRefused(f"{name} is not a block device with a request queue")
    check = holders.check(paths, name, effects or Effects())
    size = (read_int(paths.block / name / "size") or 0) * 512
    return BenchTarget(paths.dev / name, name, False, check.holds_data, check.reasons, size)


def _device_of(directory: Path, paths: HostPaths) -> str | None:
    """The whole disk under a directory's filesystem (None for tmpfs and the like)."""
    number = os.stat(directory).st_dev
    sys_dev = paths.sys / "dev" / "block" / f"{os.major(number)}:{os.minor(number)}"
    if not sys_dev.exists():
        return None
    real = Path(os.path.realpath(sys_dev))
    if (real / "partition").exists():
        real = real.parent
    return real.name if read_text(real / "dev") else None


def directory_target(directory: Path, paths: HostPaths | None = None) -> BenchTarget:
    if not directory.is_dir():
        raise BenchmarkRefused(f"{directory} is not a directory")
    usage = shutil.disk_usage(directory)
    # blkpilot writes only its own files here: the directory is scratch for them
    return BenchTarget(
        directory, _device_of(directory, paths or HostPaths()), True, False, [], usage.free
    )


def check_allowed(target: BenchTarget, workload: WorkloadSpec) -> None:
    if workload.tool == "db_bench" and not target.is_directory:
        raise BenchmarkRefused(
            f"db_bench needs a directory on a filesystem, not the raw device {target.path}"
        )
    if workload.writes and target.holds_data:
        raise BenchmarkRefused(
            f"refused: workload {workload.name} writes, and {target.path} holds data"
            f" ({'; '.join(target.reasons)}). Only scratch targets take writes: a device with"
            " no data, or a directory on a filesystem."
        )
