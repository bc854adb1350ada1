"""Boot the lab kernel under QEMU with TCG (nested KVM hangs on these machines) and collect
what the scenario printed between markers on the serial console."""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

RESULT = re.compile(r"BLKPILOT-RESULT-BEGIN (\S+)\r?\n(.*?)BLKPILOT-RESULT-END", re.S)
STATS = re.compile(r"BLKPILOT-STATS-BEGIN (\S+)\r?\n(.*?)BLKPILOT-STATS-END", re.S)
# an application's own output (db_bench's report), read by the scenario's summary
APP = re.compile(r"BLKPILOT-APP-BEGIN (\S+)\r?\n(.*?)BLKPILOT-APP-END", re.S)
DMESG = re.compile(r"BLKPILOT-DMESG-BEGIN\r?\n(.*?)BLKPILOT-DMESG-END", re.S)


class LabRunError(RuntimeError):
    pass


# printed by the guest's script when a tunable written for a variant does not read back as
# written (a value the module would not take: fios refuses one out of its range with EINVAL):
# NAME=VALUE, then what it reads
TUNABLE_NOT_SET = "BLKPILOT-TUNABLE-NOT-SET"


@dataclass
class Boot:
    console: str
    seconds: float
    results: dict[str, str] = field(default_factory=dict)
    dmesg: str = ""
    stats: dict[str, dict[str, str]] = field(default_factory=dict)  # label -> key -> value
    apps: dict[str, str] = field(default_factory=dict)  # label -> an application's output

    def kernel_problems(self) -> list[str]:
        """WARNING, BUG, Oops and taint lines: a module must leave none."""
        # word-bounded: "loops_per_jiffy" (TCG's calibration message) is no Oops
        pattern = re.compile(r"WARNING:|BUG:|\bOops\b|Call Trace|\btainted\b", re.I)
        found = [line for line in self.dmesg.splitlines() if pattern.search(line)]
        if "BLKPILOT-UNLOAD-FAILED" in self.console:
            found.append("a module did not unload")
        found += [
            f"a tunable did not take: {asked} (reads {got or 'nothing'})"
            for asked, got in re.findall(rf"{TUNABLE_NOT_SET} (\S+) ?(\S*)", self.console)
        ]
        return found


def boot(
    kernel: Path, initrd: Path, *, memory_mb: int = 1536, cpus: int = 1, timeout: float = 600
) -> Boot:
    """Boot and wait for the scenario's end. cpus > 1 boots an SMP guest (multi-threaded TCG:
    one host thread per vCPU)."""
    argv = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-m",
        str(memory_mb),
        "-smp",
        str(cpus),
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        "console=ttyS0 panic=-1 quiet loglevel=4",
        "-nographic",
        "-no-reboot",
        "-nodefaults",
        "-serial",
        "stdio",
    ]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        seen = (
            error.stdout.decode(errors="replace")
            if isinstance(error.stdout, bytes)
            else (error.stdout or "")
        )
        raise LabRunError(
            f"the guest did not finish within {timeout:.0f} s; its console ended with:\n"
            f"{seen[-3000:]}"
        ) from error
    console = done.stdout.replace("\r\n", "\n")
    if "BLKPILOT-LAB-DONE" not in console:
        raise LabRunError(
            f"the guest stopped early (exit {done.returncode}):\n"
            f"{console[-3000:]}\n{done.stderr[-1000:]}"
        )
    results = {name: body.strip() for name, body in RESULT.findall(console)}
    dmesg = DMESG.search(console)
    stats = {
        name: dict(
            pair
            for pair in (line.split(maxsplit=1) for line in body.strip().splitlines())
            if len(pair) == 2  # "key value"; a lone word or a blank line is no pair
        )
        for name, body in STATS.findall(console)
    }
    apps = {name: body.strip() for name, body in APP.findall(console)}
    return Boot(
        console, time.monotonic() - started, results, dmesg.group(1) if dmesg else "", stats, apps
    )
