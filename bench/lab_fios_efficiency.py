"""FIOS' concurrent efficiency against mq-deadline's on multi-queue devices, run by run (issue
36, item 1), in the kernel lab (Debian 6.1 under QEMU TCG).

The review's five cases (lab_fios_review: 4 + 4 with think time, 4 KB against 128 KB, deep
writers, a 1 ms thinker against four writers, one reader against seven writers) on flashsim
and on null_blk, each with a hardware queue per vCPU, under mq-deadline and fios (calibrated
on both devices in a boot of its own, as the agent calibrates a scratch device; the review's
20 ms slices). One run's efficiency — the sum of its tasks' IOPS over their IOPS alone —
swings by 10-40 % from run to run under TCG, for either scheduler, so a single run's lowest
ratio over ten cases says more about the noise than about fios. Here the two are run
`--rounds` times in one boot, alternated (mq-deadline first in even rounds, fios first in
odd), and each case's rounds are compared in pairs: fios' efficiency over mq-deadline's in
the same round, their geometric mean and range, and in how many rounds fios kept the device
at least as busy. Each round's fairness (worst over proportional slowdown) stands beside it, and
the guest's CPU over each run of the tasks together: its busy share and busy µs per request
(on null_blk the device's time is the guest's CPU, so a gap in efficiency is either fios
costing more a request — a higher busy µs per request — or holding work while the CPU could
run it — a lower busy share).

    python -m bench.lab_fios_efficiency --cpus 2 --rounds 4 --seconds 4
    python -m bench.lab_fios_efficiency --cpus 2 --cases 1r7w,1r-think1ms-4w   # some cases

Records bench/results/lab_fios_efficiency_cpus{2,4}.*
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from typing import Any

from bench.record import provenance, record
from kernel.lab.scenarios import SCENARIOS, efficiency_cases, efficiency_script, run

COLUMNS = {
    "rounds": "rounds",
    "fios efficiency / mq-deadline, geometric mean of the rounds (lowest case)": "lowest",
    "cases where fios is below in most rounds": "below",
    "fios worst / proportional (highest round)": "fios_worst",
    "fios epochs (fewest)": "fios_epochs_min",
    "per case: geometric mean [range] (rounds fios ≥), fios worst/proportional max": "table",
    "per case: guest busy µs a request, fios / mq-deadline (geometric mean); busy share, fios"
    " / mq-deadline": "cpu",
    "kernel": "kernel",
}


def judged(cases: dict[str, Any]) -> dict[str, Any]:
    """What the rounds say across the cases: the lowest geometric mean of the paired ratios,
    the cases where fios was less efficient in more than half the rounds, fios' worst
    fairness in any round, and a cell per case for the results table."""
    means = {name: case["ratio_geomean"] for name, case in cases.items() if case["ratios"]}
    below = sorted(
        name
        for name, case in cases.items()
        if case["ratios"] and case["fios_at_least_as_busy"] * 2 < len(case["ratios"])
    )
    worst = [w for case in cases.values() for w in case["worst_over_proportional"]["fios"]]
    epochs = [e for case in cases.values() for e in case["fios_epochs"] if e is not None]
    cpu = []
    for name, case in cases.items():
        ratios = case.get("busy_us_per_io_ratios") or []
        shares = {
            s: [run["busy_share"] for run in case.get("guest_cpu", {}).get(s, []) if run]
            for s in ("fios", "mq-deadline")
        }
        if ratios and all(shares.values()):
            cpu.append(
                f"{name}: {round(statistics.geometric_mean(ratios), 3)};"
                f" {round(statistics.mean(shares['fios']), 2)}"
                f" / {round(statistics.mean(shares['mq-deadline']), 2)}"
            )
    return {
        "lowest": min(means.values(), default=None),
        "cpu": "; ".join(cpu) or None,
        "all_cases_geomean": (
            round(statistics.geometric_mean(means.values()), 3) if means else None
        ),
        "below": ", ".join(below) or "none",
        "fios_worst": max(worst, default=None),
        "fios_epochs_min": min(epochs, default=None),
        "table": "; ".join(
            f"{name}: {case['ratio_geomean']} [{min(case['ratios'])}-{max(case['ratios'])}]"
            f" ({case['fios_at_least_as_busy']}/{len(case['ratios'])}),"
            f" {max(case['worst_over_proportional']['fios'])}"
            for name, case in cases.items()
            if case["ratios"]
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--cpus", type=int, choices=(2, 4), default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument(
        "--cases",
        help="only these cases, comma-separated as the results name them (1r7w,1r7w@nullb0);"
        " a subset is never recorded",
    )
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    name = f"efficiency-smp{args.cpus}"
    scenario = None
    if args.cases:
        try:
            workloads, devices = efficiency_cases(args.cases.split(","))
        except ValueError as e:
            parser.error(str(e))
        scenario = replace(SCENARIOS[name], script=efficiency_script(args.cpus, workloads, devices))
    result = run(name, rounds=args.rounds, seconds=args.seconds, scenario=scenario)
    cases = result.summary["cases"]
    doc = {
        "benchmark": "lab_fios_efficiency",
        "kernel": result.kernel,
        "cpus": args.cpus,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "fios_tunables": result.tunables,
        "cases": cases,
        **judged(cases),
        "kernel_problems": result.kernel_problems,
        "boot_seconds": round(result.boot_seconds, 1),
        **provenance("lab_fios_efficiency.py"),
    }
    print(json.dumps(doc, indent=2))
    recordable = not args.no_record and not args.cases
    if recordable and doc["lowest"] is not None and not math.isnan(doc["lowest"]):
        record(f"lab_fios_efficiency_cpus{args.cpus}", doc, COLUMNS)
    return 0 if not doc["kernel_problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
