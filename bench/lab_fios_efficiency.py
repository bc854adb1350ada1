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
    python -m bench.lab_fios_efficiency --cpus 2 --set alpha_permille=0        # a variant
    python -m bench.lab_fios_efficiency --cpus 2 --pool 07d8531 61cacc3        # no boot

Records bench/results/lab_fios_efficiency_cpus{2,4}.*

On null_blk a round's ratio swings with how fast the emulator ran it: fio's own user-space CPU
per request — work no block scheduler does — differed by up to 2x between the two
schedulers' runs of a round, and the ratio went the other way (`at_equal_user_cpu`). So each
boot also gives the ratio fitted at equal user CPU, with its 95 % interval; `--pool` fits it,
and each case's geometric mean with its interval, over the rounds of several recorded boots of
the same fios.c (the git revisions whose bench/results/lab_fios_efficiency_cpus*.json hold
them), and records that in lab_fios_efficiency_pooled_cpus*.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from dataclasses import replace
from typing import Any

from scipy import stats

from bench.record import ROOT, provenance, record
from kernel.lab.scenarios import (
    EFFICIENCY_DEVICES,
    REVIEW_WORKLOADS,
    SCENARIOS,
    efficiency_cases,
    efficiency_script,
    fios_settings,
    paired_difference,
    run,
)

COLUMNS = {
    "rounds": "rounds",
    "fios efficiency / mq-deadline, geometric mean of the rounds (lowest case)": "lowest",
    "cases where fios is below in most rounds": "below",
    "fios worst / proportional (highest round)": "fios_worst",
    "fios epochs (fewest)": "fios_epochs_min",
    "per case: geometric mean [range] (rounds fios ≥), fios worst/proportional max": "table",
    "per case: guest busy µs a request, fios / mq-deadline (geometric mean); busy share, fios"
    " / mq-deadline": "cpu",
    "null_blk: fios / mq-deadline at equal fio user CPU a request [95 % interval]"
    " (rounds)": "equal_user_cpu",
    "kernel": "kernel",
}
POOLED_COLUMNS = {
    "boots (their commits)": "boots",
    "null_blk rounds": "null_rounds",
    "null_blk: geometric mean of the ratios": "null_geomean",
    "null_blk: ratio against fio user CPU ratio, Spearman rho (p)": "null_spearman",
    "null_blk: fios / mq-deadline at equal fio user CPU [95 % interval]": "equal_user_cpu",
    "per case: geometric mean [95 % interval] (rounds fios ≥ / rounds)": "table",
}
NULL_BLK = "@nullb0"


def _interval(logs: list[float]) -> tuple[float, float, float] | None:
    """The geometric mean of ratios given as logs, and its two-sided 95 % t interval (the lab's
    paired-round interval, on the logs)."""
    if len(logs) < 2:
        return None
    found = paired_difference(logs)
    return math.exp(found["mean"]), math.exp(found["low"]), math.exp(found["high"])


def _cell(found: tuple[float, ...] | None) -> str | None:
    if found is None:
        return None
    value, low, high = found
    return f"{value:.3f} [{low:.3f}-{high:.3f}]"


def user_cpu_pairs(cases: dict[str, Any]) -> list[tuple[float, float]]:
    """Per null_blk round: (log of fios' fio user µs a request over mq-deadline's, log of
    fios' efficiency over mq-deadline's). Rounds without the guest's CPU are left out."""
    pairs = []
    for name, case in cases.items():
        if not name.endswith(NULL_BLK):
            continue
        cpu = case.get("guest_cpu", {})
        for index, ratio in enumerate(case["ratios"]):
            runs = [cpu.get(s, []) for s in ("fios", "mq-deadline")]
            fios, mq = (
                run[index].get("user_us_per_io") if index < len(run) else None for run in runs
            )
            if fios and mq and ratio > 0:
                pairs.append((math.log(fios / mq), math.log(ratio)))
    return pairs


def at_equal_user_cpu(cases: dict[str, Any]) -> dict[str, Any] | None:
    """On null_blk the device's time is the guest's CPU, and under TCG the guest's CPU runs
    as fast as the emulator does at that moment. fio's user-space CPU a request is the same
    work under either scheduler, so its ratio between a round's two runs measures how much
    faster the emulator ran one than the other. A least-squares line of the log efficiency
    ratio against the log user-CPU ratio, over every null_blk round, crosses zero user-CPU
    difference at fios' ratio with that noise taken out: the intercept, with its 95 %
    interval (t, n - 2). With the slope and the rank correlation. None under 4 rounds."""
    pairs = user_cpu_pairs(cases)
    if len(pairs) < 4:
        return None
    x, y = zip(*pairs, strict=True)
    if len(set(x)) < 2:
        return None
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.975, len(pairs) - 2) * fit.intercept_stderr
    rho = stats.spearmanr(x, y)
    return {
        "rounds": len(pairs),
        "ratio": round(math.exp(fit.intercept), 3),
        "low": round(math.exp(fit.intercept - half), 3),
        "high": round(math.exp(fit.intercept + half), 3),
        "slope": round(fit.slope, 3),
        "spearman": round(float(rho.statistic), 2),
        "spearman_p": float(f"{rho.pvalue:.2g}"),
    }


def _equal_cell(found: dict[str, Any] | None) -> str | None:
    if found is None:
        return None
    return f"{found['ratio']} [{found['low']}-{found['high']}] ({found['rounds']})"


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
    equal = at_equal_user_cpu(cases)
    return {
        "lowest": min(means.values(), default=None),
        "cpu": "; ".join(cpu) or None,
        "at_equal_user_cpu": equal,
        "equal_user_cpu": _equal_cell(equal),
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


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise ValueError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def recorded_boots(revisions: list[str], cpus: int) -> list[dict[str, Any]]:
    """The results each revision recorded for `cpus` vCPUs — one boot each, all of the same
    fios.c (the module at the commit each boot ran); ValueError otherwise."""
    docs = [
        json.loads(_git("show", f"{rev}:bench/results/lab_fios_efficiency_cpus{cpus}.json"))
        for rev in revisions
    ]
    seen = {doc["commit"] for doc in docs}
    if len(seen) < len(docs):
        raise ValueError(f"the same boot twice: {revisions} recorded runs of {sorted(seen)}")
    modules = {
        doc["commit"]: _git("rev-parse", f"{doc['commit']}:kernel/fios/fios.c").strip()
        for doc in docs
    }
    if len(set(modules.values())) > 1:
        raise ValueError(f"boots of different fios.c cannot be pooled: {modules}")
    return docs


def pooled(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of several boots as one: per case, the geometric mean of the paired ratios
    with its 95 % interval; over null_blk, the same, and the ratio at equal fio user CPU."""
    cases: dict[str, Any] = {}
    for doc in docs:
        for name, case in doc["cases"].items():
            into = cases.setdefault(name, {"ratios": [], "guest_cpu": {}})
            width = len(case["ratios"])
            into["ratios"] += case["ratios"]
            for s in ("fios", "mq-deadline"):
                runs = case.get("guest_cpu", {}).get(s, [])
                into["guest_cpu"].setdefault(s, []).extend([*runs, *[{}] * (width - len(runs))])
    null = [
        math.log(r)
        for name, case in cases.items()
        if name.endswith(NULL_BLK)
        for r in case["ratios"]
    ]
    equal = at_equal_user_cpu(cases)
    intervals = {
        name: _interval([math.log(r) for r in case["ratios"]]) for name, case in cases.items()
    }
    return {
        "boots": ", ".join(doc["commit"] for doc in docs),
        "null_rounds": len(null),
        "null_geomean": _cell(_interval(null)),
        "null_spearman": equal and f"{equal['spearman']} ({equal['spearman_p']})",
        "at_equal_user_cpu": equal,
        "equal_user_cpu": _equal_cell(equal),
        "cases": intervals,
        "table": "; ".join(
            f"{name}: {_cell(intervals[name])}"
            f" ({sum(r >= 1.0 for r in case['ratios'])}/{len(case['ratios'])})"
            for name, case in cases.items()
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
    parser.add_argument(
        "--pool",
        nargs="+",
        metavar="REV",
        help="no boot: pool the rounds the results at these git revisions recorded",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a fios tunable written over the calibrated ones on both devices (a variant to"
        " try; never recorded)",
    )
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if args.pool:
        try:
            docs = recorded_boots(args.pool, args.cpus)
        except ValueError as e:
            parser.error(str(e))
        doc = {"benchmark": "lab_fios_efficiency_pooled", "cpus": args.cpus, **pooled(docs)}
        doc |= provenance("lab_fios_efficiency.py")
        print(json.dumps(doc, indent=2))
        if not args.no_record:
            record(f"lab_fios_efficiency_pooled_cpus{args.cpus}", doc, POOLED_COLUMNS)
        return 0
    name = f"efficiency-smp{args.cpus}"
    scenario = None
    if args.cases or args.set:
        try:
            workloads, devices = (
                efficiency_cases(args.cases.split(","))
                if args.cases
                else (REVIEW_WORKLOADS, EFFICIENCY_DEVICES)
            )
            settings = fios_settings(args.set)
        except ValueError as e:
            parser.error(str(e))
        script = efficiency_script(args.cpus, workloads, devices, settings)
        scenario = replace(SCENARIOS[name], script=script)
    result = run(name, rounds=args.rounds, seconds=args.seconds, scenario=scenario)
    cases = result.summary["cases"]
    doc = {
        "benchmark": "lab_fios_efficiency",
        "kernel": result.kernel,
        "cpus": args.cpus,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "fios_tunables": result.tunables,
        "fios_settings": fios_settings(args.set),
        "cases": cases,
        **judged(cases),
        "kernel_problems": result.kernel_problems,
        "boot_seconds": round(result.boot_seconds, 1),
        **provenance("lab_fios_efficiency.py"),
    }
    print(json.dumps(doc, indent=2))
    recordable = not args.no_record and not args.cases and not args.set
    if recordable and doc["lowest"] is not None and not math.isnan(doc["lowest"]):
        record(f"lab_fios_efficiency_cpus{args.cpus}", doc, COLUMNS)
    return 0 if not doc["kernel_problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
