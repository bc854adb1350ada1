"""The schedulers' gaps on the fleet tests' loop devices: which workload lets a canary tell
none, mq-deadline and bfq apart on a busy 2-core machine.

The fleet tests (tests/test_rollouts.py) need canaries that decide: one scheduler clearly better
than another. On tmpfs-backed loop devices the block layer's cost is a share of a CPU-bound
path, so the gaps depend on the workload: at queue depth 1 they are within a busy machine's
noise, at depth 32 they are not. Each workload runs under each scheduler in alternating rounds
(round r: none, mq-deadline, bfq, …), so the host's drift falls on all alike; the medians and
each scheduler's range over rounds are recorded in bench/results/fleet_gaps.*

    python -m bench.fleet_gaps                  # depth 1 and 32, 6 rounds of 0.7 s; quiet
    python -m bench.fleet_gaps --hog            # the same with a CPU hog on core 0
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from agent.bench.library import library
from agent.bench.measure import measure
from agent.bench.target import device_target
from agent.host import HostPaths
from bench.record import provenance, record
from kernel.lab import devices as lab

SCHEDULERS = ("none", "mq-deadline", "bfq")
WORKLOADS = ("hs23-single-randread-4k-qd1", "hs23-single-randread-4k-qd32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=0.7)
    parser.add_argument("--hog", action="store_true", help="a CPU hog on core 0 throughout")
    args = parser.parse_args()
    started = provenance("fleet_gaps.py")
    hog = (
        subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
        if args.hog
        else None
    )
    backing = lab.TMPFS / f"blkpilot-gaps-{uuid.uuid4().hex[:8]}.img"
    device = lab.attach(backing, 64 << 20, direct_io=True)
    scheduler_file = Path(f"/sys/block/{device}/queue/scheduler")
    cells: dict[str, dict[str, dict[str, list[float]]]] = {}
    try:
        target = device_target(HostPaths(), device)
        with tempfile.TemporaryDirectory() as workdir:
            for name in WORKLOADS:
                spec = library()[name].model_copy(
                    update={"duration_s": args.seconds, "warmup_s": 0.2}
                )
                for _ in range(args.rounds):
                    for scheduler in SCHEDULERS:
                        scheduler_file.write_text(scheduler)
                        metrics = measure(
                            spec, target, workdir=Path(workdir), with_fairness=False
                        ).metrics
                        cell = cells.setdefault(name, {}).setdefault(scheduler, {})
                        for metric in ("iops", "lat_p50_us", "lat_p99_us"):
                            cell.setdefault(metric, []).append(metrics[metric])
    finally:
        scheduler_file.write_text("none")
        lab.detach(device, backing)
        if hog is not None:
            hog.kill()
            hog.wait()
    summary = {
        name: {
            scheduler: {
                metric: {
                    "median": round(statistics.median(values), 1),
                    "min": round(min(values), 1),
                    "max": round(max(values), 1),
                }
                for metric, values in by_metric.items()
            }
            for scheduler, by_metric in by_scheduler.items()
        }
        for name, by_scheduler in cells.items()
    }

    def iops(name: str) -> str:
        return " / ".join(
            f"{s} {summary[name][s]['iops']['median'] / 1000:.0f}k" for s in SCHEDULERS
        )

    result = {
        **started,
        "condition": "CPU hog on core 0" if args.hog else "quiet",
        "rounds": args.rounds,
        "seconds": args.seconds,
        "summary": summary,
        "qd1": iops(WORKLOADS[0]),
        "qd32": iops(WORKLOADS[1]),
    }
    record(
        "fleet_gaps",
        result,
        {
            "condition": "condition",
            "rounds": "rounds",
            "IOPS at QD1": "qd1",
            "IOPS at QD32": "qd32",
        },
    )
    print(f"QD1:  {result['qd1']}\nQD32: {result['qd32']}")


if __name__ == "__main__":
    main()
