"""The scheduler's own cost per request, which host load cannot move: every hook of mq-deadline
and fios timed inside the lab guest by the function-graph tracer (kernel/lab/hooks.py), medians
per hook over every call, both schedulers in the same boot, on null_blk. A request's cost is the
sum over hooks of calls per request times the hook's median, as timed and above the tracer's
own cost per call; and how many queue re-runs (kblockd work, outside the hooks' time) fios'
completions asked for per request, by fios' own count.
Records to bench/results/lab_hooks.*

    python -m bench.lab_hooks                    # 3 rotated rounds of 10 s per workload
"""

from __future__ import annotations

import argparse
import json

from bench.record import provenance, record
from kernel.lab import hooks
from kernel.lab.scenarios import run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    result = run("null-hooks", rounds=args.rounds, seconds=args.seconds)
    summary = result.summary
    doc: dict[str, object] = {
        "benchmark": "lab_hooks",
        "kernel": result.kernel,
        "rounds_seconds": f"{args.rounds} x {args.seconds:g}",
        "untraceable": summary["untraceable"],
        "kernel_problems": len(result.kernel_problems),
        **provenance("lab_hooks.py"),
    }
    for workload in hooks.WORKLOADS:
        cases = summary[workload]
        for scheduler in hooks.HOOKS:
            case = cases[scheduler]
            doc[f"{workload}_{scheduler}_requests"] = case["requests"]
            doc[f"{workload}_{scheduler}_ns"] = case["per_request_ns"]
            doc[f"{workload}_{scheduler}_above_floor_ns"] = case["above_floor_ns"]
            doc[f"{workload}_{scheduler}_runs_lost"] = case["runs_lost"]
            doc[f"{workload}_{scheduler}_hooks"] = {
                name: f"{h['per_request']} x {h['median_ns']:.0f} ns (p90 {h['p90_ns']:.0f})"
                for name, h in case["hooks"].items()
            }
        fios = cases["fios"]
        # the queue re-runs (kblockd work) fios' completions asked for, per request
        doc[f"{workload}_fios_kicks_per_request"] = fios.get("kicks_per_request")
        doc[f"{workload}_floor_ns"] = cases["floor_ns"]
        doc[f"{workload}_fios_over_mq_deadline"] = cases["fios_over_mq_deadline_above_floor"]
    # a sequential reader's and writer's bios merged by fios (kernel/lab/hooks.py MERGES)
    doc["fios_merges"] = summary["merges"]
    print(json.dumps(doc, indent=2))
    if not args.no_record:
        columns = {"rounds x s": "rounds_seconds"}
        for workload in hooks.WORKLOADS:
            columns |= {
                f"{workload} requests (dl/fios)": f"{workload}_requests",
                f"{workload} mq-deadline ns above floor": f"{workload}_mq-deadline_above_floor_ns",
                f"{workload} fios ns above floor": f"{workload}_fios_above_floor_ns",
                f"{workload} fios / mq-deadline": f"{workload}_fios_over_mq_deadline",
                f"{workload} fios kicks / request": f"{workload}_fios_kicks_per_request",
                f"{workload} floor ns": f"{workload}_floor_ns",
            }
            doc[f"{workload}_requests"] = (
                f"{doc[f'{workload}_mq-deadline_requests']}/{doc[f'{workload}_fios_requests']}"
            )
        columns["kernel"] = "kernel"
        record("lab_hooks", doc, columns)
    lost = any(doc[f"{w}_{s}_runs_lost"] for w in hooks.WORKLOADS for s in hooks.HOOKS)
    return 1 if lost or result.kernel_problems or summary["untraceable"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
