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


def tree_cpu_seconds(root: int) -> float:
    """user + system time of a process, of its children that have ended (the kernel adds them
    to the parent's cutime and cstime when it reaps them) and of those still running — a
    PostgreSQL postmaster and its backends, say."""
    fields = _stat(root)
    total = sum(int(f) for f in fields[11:15]) * TICK
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == root:
            continue
        try:
            child = _stat(int(entry.name))
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(child[1]) == root:  # its parent
            total += (int(child[11]) + int(child[12])) * TICK
    return total


def postmaster_pid(data_dir: Path) -> int:
    """The postmaster of the PostgreSQL cluster in data_dir (postmaster.pid's first line)."""
    return int((data_dir / "postmaster.pid").read_text().split()[0])
