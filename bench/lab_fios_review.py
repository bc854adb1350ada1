"""FIOS for a kernel reviewer, in the kernel lab (Debian 6.1 under QEMU TCG, flashsim):

- the harder cases (`flash-review`): 4 + 4 with a real think time (a closed loop thinking a
  read's service time), 4 KB against 128 KB reads (flashsim stripes large requests over its
  units), writers with deep queues (libaio, QD 16) against QD1 readers, a reader thinking 1 ms
  against four writers, one reader against seven writers (p99 and maximum latency) — under none,
  mq-deadline, bfq and fios (calibrated, 20 ms slices, a fresh instance per workload: its epochs
  and anticipations are that run's; on the 1 ms, deep-writer and one-against-seven cases also
  `fios+paper`, the paper's anticipation without weigh_idle, and on the 1 ms case
  `fios+nowd`, write_depth lifted; on 4 KB vs 128 KB and one against seven `fios+nolend`,
  lending off — the paper's rule); I/O priorities (best effort 0 against 4:
  weights 2:1), and cgroups at 200 and 100 (io.fios.weight, io.bfq.weight), under none, bfq
  and fios; short-lived readers started one after another
  against one writer;
- SMP and multi-queue (`smp2`, `smp4`): every scheduler on null_blk and flashsim with a queue
  per vCPU, fios switched with mq-deadline under load, rmmod while attached, fio killed while
  anticipated for; the depth limit (a reader against writers at QD 128 each) and writers alone
  in debt beyond a slice (`depth/debt`), there and on one vCPU (`flash-depth`).

TCG inflates every absolute number; compare within a run. Records bench/results/lab_fios_review.*

    python -m bench.lab_fios_review                   # 4 s runs
    python -m bench.lab_fios_review --cpus 2 --seconds 6   # the review's cases on two vCPUs,
                                                           # flashsim and null_blk with a queue
                                                           # per vCPU (lab_fios_review_cpus2.*;
                                                           # fios calibrated on both, as the
                                                           # agent calibrates a scratch device)
    python -m bench.lab_fios_review --cpus 4 --seconds 6   # four (lab_fios_review_cpus4.*)

Each case's concurrent efficiency (the sum of its tasks' IOPS over their IOPS alone) is
recorded beside its fairness, and fios' against mq-deadline's as a ratio (≥ 1: fios kept the
device at least as busy).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench.record import provenance, record
from kernel.lab.scenarios import run


def efficiency_beside_fairness(doc: dict[str, Any]) -> None:
    """Each case's concurrent efficiency beside its fairness: fios' over mq-deadline's per
    case (the lowest is the one to look at), and a cell per case for the results table —
    `worst/proportional, efficiency` under fios, then mq-deadline."""
    fairness = doc["fairness"]
    doc["efficiency"] = {
        w: {s: case["concurrent_efficiency"] for s, case in cases.items()}
        for w, cases in fairness.items()
    }
    doc["efficiency_fios_over_mq_deadline"] = {
        w: round(cases["fios"] / cases["mq-deadline"], 3)
        for w, cases in doc["efficiency"].items()
        if cases.get("mq-deadline")
    }
    doc["fios_efficiency_vs_mq_deadline_min"] = min(
        doc["efficiency_fios_over_mq_deadline"].values(), default=None
    )
    doc["cases"] = "; ".join(
        f"{w.removeprefix('fios-')}: "
        + " / ".join(
            f"{s} {cases[s]['worst_over_proportional']}, {cases[s]['concurrent_efficiency']}"
            for s in ("fios", "mq-deadline")
            if s in cases
        )
        for w, cases in fairness.items()
    )


COLUMNS = {
    "fios worst / proportional": "fios_worst",
    "fios epochs (fewest)": "fios_epochs_min",
    "fios efficiency / mq-deadline (lowest)": "fios_efficiency_vs_mq_deadline_min",
    "weights 2:1 -> fios": "weights_ratio_fios",
    "cgroups 200:100 -> fios": "cgroup_weights_ratio_fios",
    "writer kept under churn": "churn_writer_kept_fios",
    "reader mean µs, depth": "depth_reader_mean_us",
    "per case (worst/proportional, efficiency): fios / mq-deadline": "cases",
    "kernel": "kernel",
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--cpus", type=int, choices=(1, 2, 4), default=1)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    review = run(
        "flash-review" if args.cpus == 1 else f"flash-review-smp{args.cpus}", seconds=args.seconds
    )
    smp = {cpus: run(f"smp{cpus}", seconds=min(args.seconds, 1.5)) for cpus in (2, 4)}
    fairness = review.summary["fairness"]
    doc = {
        "benchmark": "lab_fios_review",
        "kernel": review.kernel,
        "fios_tunables": review.tunables.get("fios", {}),
        "fairness": fairness,
        "weights": review.summary["weights"],
        "cgroup_weights": review.summary["cgroup_weights"],
        "churn": review.summary["churn"],
        "smp": {f"smp{c}": r.summary for c, r in smp.items()},
        "kernel_problems": review.kernel_problems
        + [p for r in smp.values() for p in r.kernel_problems],
        "seconds": args.seconds,
        "cpus": args.cpus,
        **provenance("lab_fios_review.py"),
    }
    worst = {
        w: {s: case["worst_over_proportional"] for s, case in cases.items()}
        for w, cases in fairness.items()
    }
    doc["worst_over_proportional"] = worst
    efficiency_beside_fairness(doc)
    doc["fios_worst"] = max(cases["fios"] for cases in worst.values())
    doc["fios_epochs_min"] = min(cases["fios"].get("epochs", 0) for cases in fairness.values())
    doc["weights_ratio_fios"] = doc["weights"].get("fios", {}).get("ratio")
    doc["cgroup_weights_ratio_fios"] = doc["cgroup_weights"].get("fios", {}).get("ratio")
    doc["churn_writer_kept_fios"] = doc["churn"].get("fios", {}).get("writer_kept")
    depth_run = run("flash-depth", seconds=min(args.seconds, 1.5))
    doc["kernel_problems"] += depth_run.kernel_problems
    by_cpus = {1: depth_run, **smp}
    doc["depth"] = {f"cpus{c}": r.summary["depth"] for c, r in by_cpus.items()}
    doc["depth_reader_mean_us"] = {
        cpus: f"{d['default']['reader_mean_us']} (limit) / {d['off']['reader_mean_us']} (none)"
        for cpus, d in doc["depth"].items()
    }
    doc["debt_epochs"] = {
        f"cpus{c}": int(r.summary["runs"]["depth/debt"]["fios_debt_epochs"])
        for c, r in by_cpus.items()
    }
    print(json.dumps(doc, indent=2))
    if not args.no_record:
        record(
            "lab_fios_review" if args.cpus == 1 else f"lab_fios_review_cpus{args.cpus}",
            doc,
            COLUMNS,
        )
    return 0 if not doc["kernel_problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
