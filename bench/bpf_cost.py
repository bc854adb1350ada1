"""What the eBPF latency collector costs each I/O, as a node pays it: the host's CPU time per
I/O with blklat's programs attached and with them detached, in alternating phases, under fio
at full speed on a tmpfs loop device — with kernel.bpf_stats_enabled off, as on a node.

Why not bpf_stats alone (bench/agent_footprint.py's "BPF ns/IO"): with the statistics on, the
kernel times every program run with two clock reads, about 60 ns a run on this VM that a node
never pays, and it leaves out what a run costs outside the program (the tracepoint's call into
BPF, its RCU section and recursion check). Switching the programs on and off and taking the
difference of the whole host's CPU per I/O counts exactly what they add, and nothing else. One
phase with the statistics on is measured beside it, for the comparison.

Each round is a pair of phases, on and off, in an order drawn at random (as the canary orders
its pairs), so that drift in the host's speed falls on both; a phase starts a settle time after
the switch (loading the programs, the verifier's work, is not counted). CPU time is the whole
host's from /proc/stat (user, nice, system, irq, softirq: not idle, I/O wait or steal); I/Os
are the loop device's completions (/sys/block/NAME/stat). The result is the median of the
rounds' shift with a 95 % interval, by the canary's own paired judge (Hodges-Lehmann with
the Wilcoxon signed-rank interval, agent.live_judge.paired).

    python -m bench.bpf_cost                          # 10 rounds of 6 s on and 6 s off
    python -m bench.bpf_cost --scheduler mq-deadline  # four programs per I/O, insert too
    python -m bench.bpf_cost --floor                  # empty programs: attaching alone
    python -m bench.bpf_cost --rounds 3 --seconds 1 --no-record   # a look

Records in bench/results/bpf_cost.*; the target is issue 32 item 8's: at most 300 ns per I/O.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.collectors.blklat import DEFAULT_OBJECT
from agent.contract.verdict import MetricRule
from agent.ebpf.loader import BpfObject
from agent.live_judge import paired
from bench.agent_footprint import FLOOR_SOURCE, completed, full_speed
from bench.record import BUSY_IDLE_SHARE, CpuTimes, host_load, provenance, record
from kernel.lab import devices as lab

TARGET_NS_PER_IO = 300.0
RULE = MetricRule("host_cpu_ns_per_io", higher_is_better=False, tolerance=0.0)
TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
BUILD = Path(__file__).resolve().parent.parent / "agent" / "ebpf" / "build.sh"


def host_busy_ns() -> int:
    """CPU time the host spent on work, all CPUs (the `cpu` line of /proc/stat): user, nice,
    system, irq and softirq — not idle, I/O wait or time stolen by the hypervisor."""
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields[0] == "cpu":
            user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[1:8])
            return round((user + nice + system + irq + softirq) * TICK_NS)
    raise RuntimeError("/proc/stat has no cpu line")


def program_fds() -> set[int]:
    """The BPF programs this process holds open (and, for blklat's, attached), by fd."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:bpf-prog":
                found.add(int(fd))
    return found


def attached_programs() -> int:
    return len(program_fds())


def run_time(fds: set[int]) -> tuple[int, int]:
    """Nanoseconds these programs have run, and how many runs (kernel.bpf_stats_enabled=1):
    only the benchmark's own, not those of another collector in the same process."""
    total = runs = 0
    for fd in fds:
        for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
            if line.startswith("run_time_ns:"):
                total += int(line.split()[1])
            elif line.startswith("run_cnt:"):
                runs += int(line.split()[1])
    return total, runs


@dataclass
class Phase:
    attached: bool
    ios: int
    busy_ns: int
    seconds: float
    programs: int  # BPF programs held while it was measured: 4 on, 0 off

    @property
    def ns_per_io(self) -> float:
        return self.busy_ns / max(self.ios, 1)


def measure(device: str, attached: bool, seconds: float) -> Phase:
    busy0, ios0, t0 = host_busy_ns(), completed([device]), time.monotonic()
    time.sleep(seconds)
    busy1, ios1, t1 = host_busy_ns(), completed([device]), time.monotonic()
    return Phase(attached, ios1 - ios0, busy1 - busy0, t1 - t0, attached_programs())


@contextmanager
def collector(on: bool, path: Path = DEFAULT_OBJECT) -> Iterator[BpfObject | None]:
    """blklat's programs attached for the block, or nothing."""
    if not on:
        yield None
        return
    programs = BpfObject(path)
    try:
        yield programs
    finally:
        programs.close()


def run(
    rounds: int,
    seconds: float,
    settle: float,
    scheduler: str,
    seed: int,
    path: Path = DEFAULT_OBJECT,
) -> dict[str, Any]:
    rng = random.Random(seed)
    spec = {"d0": (lab.TMPFS / f"blkpilot-bpfcost-{os.getpid()}.img", 64 << 20)}
    stats_before = STATS.read_text().strip()
    phases: list[tuple[Phase, Phase]] = []
    began = CpuTimes.now()
    with lab.lab_devices(spec) as devices:
        device = devices["d0"]
        Path(f"/sys/block/{device}/queue/scheduler").write_text(scheduler)
        budget = int(rounds * 2 * (seconds + settle) + 4 * (seconds + settle) + 30)
        fio = full_speed(device, budget)
        try:
            STATS.write_text("0")
            time.sleep(settle)
            for _ in range(rounds):
                found: dict[bool, Phase] = {}
                for on in rng.sample([True, False], 2):
                    with collector(on, path):
                        time.sleep(settle)
                        found[on] = measure(device, on, seconds)
                phases.append((found[True], found[False]))
            # bpf_stats' own figure in the same run, for comparison: one phase with it on
            others = program_fds()
            with collector(True, path):
                ours = program_fds() - others
                STATS.write_text("1")
                time.sleep(settle)
                run0, count0 = run_time(ours)
                ios0 = completed([device])
                time.sleep(seconds)
                run1, count1 = run_time(ours)
                ios1 = completed([device])
                STATS.write_text("0")
        finally:
            STATS.write_text(stats_before)
            fio.terminate()
            fio.wait()
    host = host_load(began)
    differences = [on.ns_per_io - off.ns_per_io for on, off in phases]
    # the canary's own paired judge: Hodges-Lehmann on the rounds' log-ratios, with the
    # Wilcoxon signed-rank interval, in ns per I/O
    added = paired(
        {
            "A": {RULE.metric: [off.ns_per_io for _, off in phases]},
            "B": {RULE.metric: [on.ns_per_io for on, _ in phases]},
        },
        RULE,
        0.95,
    )
    centre, low, high = added.shift, added.ci_low, added.ci_high
    stats_ios = max(ios1 - ios0, 1)
    off_ns = statistics.median(off.ns_per_io for _, off in phases)
    return {
        "benchmark": "bpf_cost",
        "scheduler": scheduler,
        "rounds": rounds,
        "phase_s": seconds,
        "iops_off": round(statistics.median(off.ios / off.seconds for _, off in phases)),
        "iops_on": round(statistics.median(on.ios / on.seconds for on, _ in phases)),
        "host_cpu_ns_per_io_off": round(off_ns, 1),
        "host_cpu_ns_per_io_on": round(statistics.median(on.ns_per_io for on, _ in phases), 1),
        "added_ns_per_io": round(centre, 1),
        "added_ns_per_io_low": round(low, 1),
        "added_ns_per_io_high": round(high, 1),
        "added_percent": round(100 * added.relative_shift, 2),
        "rounds_ns": [round(d, 1) for d in differences],
        "programs_on_off": sorted({(on.programs, off.programs) for on, off in phases}),
        "bpf_stats_ns_per_io": round((run1 - run0) / stats_ios, 1),
        "bpf_stats_runs_per_io": round((count1 - count0) / stats_ios, 2),
        "target_ns_per_io": TARGET_NS_PER_IO,
        "host_load": host,
        **provenance("bpf_cost.py"),
    }


def _at_least_3(text: str) -> int:
    rounds = int(text)
    if rounds < 3:
        raise argparse.ArgumentTypeError("at least 3: the paired judge needs 3 complete pairs")
    return rounds


def method_holds(host: dict[str, Any]) -> bool:
    """The on/off comparison measures the collector's CPU only where the host had CPU to
    spare: fio's I/O rate, not the CPU time, absorbs the cost on a saturated host (a run with
    no idle time read -4,133 ns "added")."""
    idle = host.get("idle_share")
    return idle is not None and idle >= BUSY_IDLE_SHARE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=_at_least_3, default=10, help="on/off pairs (the judge needs 3 or more)"
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="a phase's measured time")
    parser.add_argument("--settle", type=float, default=1.0, help="after each switch")
    parser.add_argument("--scheduler", default="none")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--floor",
        action="store_true",
        help="empty programs on the same tracepoints (bench/ebpf/floor.bpf.c): what attaching"
        " alone costs",
    )
    parser.add_argument("--object", type=Path, help="another build of blklat, to compare")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="blkpilot-bpfcost-") as work:
        if args.floor:
            args.object = Path(work) / "floor.bpf.o"
            subprocess.run(
                ["sh", str(BUILD), str(FLOOR_SOURCE), str(args.object)],
                check=True,
            )
        path = args.object or DEFAULT_OBJECT
        result = run(args.rounds, args.seconds, args.settle, args.scheduler, args.seed, path)
    result["programs"] = "empty (floor)" if args.floor else str(args.object or "blklat")
    print(json.dumps(result, indent=2))
    if not method_holds(result["host_load"]):
        print(
            f"bpf_cost: the host had {result['host_load']['idle_share']:.0%} idle CPU over the"
            " run; the on/off method needs idle CPU (on a saturated host the collector's cost"
            " shows as fewer I/Os, not more CPU, and only fio's share is measured): no figure"
            " recorded. Run it on a quieter host.",
            file=sys.stderr,
        )
        sys.exit(2)
    if not args.no_record:
        record(
            "bpf_cost",
            result,
            {
                "programs": "programs",
                "scheduler": "scheduler",
                "rounds": "rounds",
                "phase s": "phase_s",
                "IOPS off": "iops_off",
                "IOPS on": "iops_on",
                "host CPU ns/IO off": "host_cpu_ns_per_io_off",
                "added ns/IO": "added_ns_per_io",
                "95 % interval low": "added_ns_per_io_low",
                "95 % interval high": "added_ns_per_io_high",
                "added %": "added_percent",
                "bpf_stats ns/IO": "bpf_stats_ns_per_io",
                "runs/IO": "bpf_stats_runs_per_io",
            },
        )
    met = result["added_ns_per_io_high"] <= TARGET_NS_PER_IO
    print(
        f"{result['programs']} adds {result['added_ns_per_io']} ns of host CPU per I/O"
        f" (95 % interval {result['added_ns_per_io_low']} … {result['added_ns_per_io_high']});"
        f" bpf_stats says {result['bpf_stats_ns_per_io']}; target ≤ {TARGET_NS_PER_IO:g}:"
        f" {'met' if met else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
