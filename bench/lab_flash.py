"""The kernel lab on the flash-like test device (flashsim, Debian 6.1 under QEMU TCG):

- FIOS's synthetic cases (1 reader + 1 writer, 4 + 4, 4 + 4 with exponential thinktime,
  4 KB reader against 128 KB reader) under none, mq-deadline, kyber and bfq: each task's
  slowdown against running alone, worst-case slowdown over proportional, concurrent efficiency;
- HotStorage '22's comparison at a ULL-like (5 µs) and a flash-like (80 µs) read latency:
  interrupts, classic polling and hybrid polling, 4 KB and 128 KB reads.

TCG inflates every absolute number; compare within a run. Records bench/results/lab_flash.*

    python bench/lab_flash.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.record import RESULTS, provenance  # noqa: E402
from kernel.lab.scenarios import run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    fairness = run("flash-fairness", seconds=args.seconds)
    polling = run("flash-polling", rounds=2, seconds=args.seconds)
    doc = {
        "benchmark": "lab_flash",
        "kernel": fairness.kernel,
        "fairness": fairness.summary,
        "polling": polling.summary,
        "kernel_problems": fairness.kernel_problems + polling.kernel_problems,
        **provenance("lab_flash.py"),
    }
    print(json.dumps(doc, indent=2))
    if not args.no_record:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "lab_flash.json").write_text(json.dumps(doc, indent=2) + "\n")
        lines = [f"# lab_flash ({doc['when']}, {doc['commit']}, `{doc['command']}`)", "",
                 "| workload | scheduler | worst slowdown / proportional | concurrent efficiency |",
                 "|---|---|---|---|"]  # fmt: skip
        for workload, cases in fairness.summary.items():
            for scheduler, case in cases.items():
                lines.append(
                    f"| {workload} | {scheduler} | {case['worst_over_proportional']} |"
                    f" {case['concurrent_efficiency']} |"
                )
        lines += ["", "| device/size/mode | mean µs | p50 µs | ctx switches per I/O | sys CPU % |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for key, cell in polling.summary.items():
            lines.append(
                f"| {key} | {cell['lat_mean_us']} | {cell['lat_p50_us']} |"
                f" {cell['context_switches_per_io']} | {cell['cpu_sys_pct']} |"
            )
        (RESULTS / "lab_flash.md").write_text("\n".join(lines) + "\n")
    return 0 if not doc["kernel_problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
