"""CPU time of processes from /proc: the unit of cost that holds on a busy host, where wall
rates do not (a benchmark compares work done per CPU second, not per wall second)."""

from __future__ import annotations

import os
from pathlib import Path

TICK = 1 / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    # the fields after the command name, which may hold spaces and parentheses
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """user + system time of one process, all its threads."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) * TICK


def run_ns(pid: int) -> int:
    """Time on a CPU of every thread of a running process, in nanoseconds
    (/proc/PID/task/TID/schedstat's first field): exact, where stat's utime and stime come in
    10 ms ticks and a backend that ran 8 ms in a short run reads 0."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return total


def tree_cpu_seconds(root: int) -> float:
    """user + system time of a process, of its children that have ended (the kernel adds them
    to the parent's cutime and cstime when it reaps them, in ticks) and of those still running
    (in nanoseconds: a short run's backends each spend less than a tick) — a PostgreSQL
    postmaster and its backends, say."""
    fields = _stat(root)
    total = sum(int(f) for f in fields[13:15]) * TICK + run_ns(root) / 1e9
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == root:
            continue
        try:
            if int(_stat(int(entry.name))[1]) != root:  # not its child
                continue
            total += run_ns(int(entry.name)) / 1e9
        except (OSError, IndexError):
            continue  # ended meanwhile
    return total


def postmaster_pid(data_dir: Path) -> int:
    """The postmaster of the PostgreSQL cluster in data_dir (postmaster.pid's first line)."""
    return int((data_dir / "postmaster.pid").read_text().split()[0])


def peak_rss_mib(pid: int) -> float:
    """The most resident memory the process has held (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise ValueError(f"no VmHWM for {pid}")
