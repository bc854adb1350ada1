"""Lab block devices on this host: loop devices with direct I/O on a tmpfs file (memory speed,
ULL-like) or on a file on disk (SSD-like). They are created empty; nothing else ever lives on
them. The scheduler reset goes through the agent's `Effects`, like every sysfs write."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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


@dataclass
class DataDevice:
    """A lab device that holds data, as a user's would: ext4, mounted, with files on it."""

    name: str
    mountpoint: Path
    data_file: Path  # what the workloads read and write
    checksums: dict[Path, str]  # files no workload touches, and their SHA-256
    fsck: str = ""  # `fsck -n` after unmounting: its output, when it found something
    files_intact: bool | None = None  # the checksummed files, checked before unmounting

    def unchanged(self) -> bool:
        return all(_sha256(path) == digest for path, digest in self.checksums.items())


def _run(*argv: str, timeout: float = 120) -> str:
    result = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def data_device(
    backing: Path, size_bytes: int, mountpoint: Path, *, data_bytes: int = 256 << 20
) -> Iterator[DataDevice]:
    """A loop device holding ext4 (inode tables and journal initialised up front, so the
    filesystem writes nothing by itself later), mounted noatime, with a data file for
    workloads and a few small files whose checksums are kept. On exit: unmounted, checked
    with `fsck -n` (the result is kept on the object), detached and deleted."""
    release_stale(backing)
    name = attach(backing, size_bytes)
    mounted = False
    device = DataDevice(name, mountpoint, mountpoint / "data", {})
    try:
        _run(
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            "blkpilot-lab",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            f"/dev/{name}",
        )
        mountpoint.mkdir(parents=True, exist_ok=True)
        _run("mount", "-o", "noatime", f"/dev/{name}", str(mountpoint))
        mounted = True
        _run(
            "fio",
            "--name=fill",
            f"--filename={device.data_file}",
            f"--size={data_bytes}",
            "--rw=write",
            "--bs=1M",
            "--direct=1",
            "--output=/dev/null",
        )
        notes = mountpoint / "notes"
        notes.mkdir()
        for index in range(4):
            path = notes / f"note-{index}.txt"
            path.write_bytes(os.urandom(64 << 10))
            device.checksums[path] = _sha256(path)
        _run("sync")
        yield device
    finally:
        if mounted:
            device.files_intact = device.unchanged()
            for attempt in range(20):
                result = subprocess.run(
                    ["umount", str(mountpoint)], capture_output=True, text=True, check=False
                )
                if result.returncode == 0:
                    break
                time.sleep(0.25 * (attempt + 1))
        check = subprocess.run(
            ["fsck.ext4", "-n", "-f", f"/dev/{name}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check.returncode != 0:
            device.fsck = (check.stdout + check.stderr).strip() or f"exit {check.returncode}"
        detach(name, backing)


def start_workload(
    data_file: Path,
    *,
    rw: str = "randread",
    block_size: str = "4k",
    iodepth: int = 4,
    jobs: int = 1,
    engine: str = "io_uring",
    seconds: float = 86_400,
    rate_iops: int | None = None,
    thinktime_us: int | None = None,
    distinct_priorities: bool = False,
    device: str | None = None,
) -> subprocess.Popen[str]:
    """The "production" traffic: fio on a file in the filesystem, running until stopped. With
    `device`, returns once the traffic reaches it.

    `thinktime_us`: each job pauses this long after every I/O, as an application does between
    the reads it needs. `distinct_priorities`: each job runs at its own best-effort I/O
    priority (0, 1, ...), as a database's backends and background workers do; jobs of one
    priority that start together are served as one queue by bfq (its "stable merge" of queues
    created within 600 ms of each other), jobs of different priorities never are."""
    argv = [
        "fio",
        f"--filename={data_file}",
        f"--rw={rw}",
        f"--bs={block_size}",
        f"--iodepth={iodepth}",
        f"--ioengine={engine}",
        "--direct=1",
        "--time_based",
        f"--runtime={seconds:g}",
        "--group_reporting",
        "--output-format=json",
        "--randrepeat=0",
        # total latency's percentiles too (submission + completion): with io_uring a request
        # reaches the device inside the submitting call, before fio's completion clock starts
        "--lat_percentiles=1",
    ]
    if rate_iops:
        argv.append(f"--rate_iops={max(1, rate_iops // jobs)}")
    if thinktime_us:
        argv += [f"--thinktime={thinktime_us}us", "--thinktime_blocks=1"]
    if distinct_priorities:  # one job section each (group_reporting still sums them)
        if jobs > 8:
            raise ValueError(f"{jobs} jobs: the best-effort class has 8 priorities")
        argv.append("--prioclass=2")
        argv += [arg for job in range(jobs) for arg in (f"--name=production{job}", f"--prio={job}")]
    else:
        argv += ["--name=production", f"--numjobs={jobs}"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if device is not None:
        stat = Path(f"/sys/block/{device}/stat")
        first = _completed(stat)
        deadline = time.monotonic() + 20
        while _completed(stat) < first + 1000:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_workload(process)
                raise LabError(f"no traffic reached {device} from fio on {data_file}")
            time.sleep(0.05)
    return process


def _completed(stat: Path) -> int:
    fields = stat.read_text().split()
    return int(fields[0]) + int(fields[4])  # reads and writes completed


def stop_workload(process: subprocess.Popen[str]) -> str:
    """Stops it (fio finishes cleanly on SIGINT) and returns its JSON report."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return out
