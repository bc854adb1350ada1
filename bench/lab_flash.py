"""The kernel lab on the flash-like test device (flashsim, Debian 6.1 under QEMU TCG):

- FIOS's synthetic cases (1 reader + 1 writer, 4 + 4, 4 + 4 with exponential thinktime,
  4 KB reader against 128 KB reader) under none, mq-deadline, kyber, bfq and fios (calibrated by
  the agent's procedure, alpha 0.5), plus fios without anticipation, without read preference
  and without calibration: each task's slowdown against running alone, worst-case slowdown over
  proportional, concurrent efficiency, and the issue's claims checked case by case;
- HotStorage '22's comparison at a ULL-like (5 µs) and a flash-like (80 µs) read latency:
  interrupts, classic polling and hybrid polling, 4 KB and 128 KB reads.

TCG inflates every absolute number; compare within a run. Records bench/results/lab_flash.*

    python -m bench.lab_flash
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.record import out_dir, provenance, record, recording
from kernel.lab.scenarios import FLASH_LIKE, STOCK, run

ROOT = Path(__file__).resolve().parent.parent

RW_CASES = ("fios-1r1w", "fios-4r4w", "fios-4r4w-think")


def claims(summary: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, object]]:
    """Per reader/writer case: do none and mq-deadline leave readers 3x or more beyond the
    proportional slowdown; does fios keep every task within 1.5x of it; is its concurrent
    efficiency at least 0.9 of the best stock scheduler's."""
    checked: dict[str, dict[str, object]] = {}
    for workload, cases in summary.items():
        best = max(cases[s]["concurrent_efficiency"] for s in STOCK)
        readers_blocked = (
            all(
                min(v for k, v in cases[s]["slowdowns"].items() if k.startswith("reader"))  # type: ignore[attr-defined]
                >= 3 * cases[s]["proportional_slowdown"]
                for s in ("none", "mq-deadline")
            )
            if workload in RW_CASES
            else None
        )
        checked[workload] = {
            "stock_readers_3x_beyond_proportional": readers_blocked,
            "fios_within_1_5x_proportional": cases["fios"]["worst_over_proportional"] <= 1.5,
            "fios_efficiency_over_best_stock": round(
                cases["fios"]["concurrent_efficiency"] / best, 3
            ),
        }
    return checked


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
        "device": FLASH_LIKE,
        "fios_tunables": fairness.tunables,
        "claims": (checked := claims(fairness.summary)),
        "fairness": fairness.summary,
        "fios_stats": {k: v for k, v in fairness.stats.items() if k.endswith("/together")},
        "polling": polling.summary,
        "kernel_problems": fairness.kernel_problems + polling.kernel_problems,
        **provenance("lab_flash.py"),
    }
    print(json.dumps(doc, indent=2))
    if recording() and not args.no_record:
        out = out_dir()
        out.mkdir(parents=True, exist_ok=True)
        (out / "lab_flash.json").write_text(json.dumps(doc, indent=2) + "\n")
        lines = [
            f"# lab_flash ({doc['when']}, {doc['commit']}, `{doc['command']}`)",
            "",
            f"flashsim: `{FLASH_LIKE}`; fios tunables from the agent's calibration:"
            f" `{fairness.tunables.get('fios')}`",
            "",
            "| case | stock readers >= 3x prop. | fios <= 1.5x prop. | fios eff. / best |",
            "|---|---|---|---|",
            *(
                f"| {w} | {c['stock_readers_3x_beyond_proportional']} |"
                f" {c['fios_within_1_5x_proportional']} |"
                f" {c['fios_efficiency_over_best_stock']} |"
                for w, c in checked.items()
            ),
            "",
            "| workload | scheduler | worst slowdown / proportional | concurrent efficiency |",
            "|---|---|---|---|",
        ]
        for workload, cases in fairness.summary.items():
            for scheduler, case in cases.items():
                lines.append(
                    f"| {workload} | {scheduler} | {case['worst_over_proportional']} |"
                    f" {case['concurrent_efficiency']} |"
                )
        lines += [
            "",
            "| device/size/mode | mean µs | p50 µs | ctx switches per I/O | sys CPU % |",
            "|---|---|---|---|---|",
        ]
        for key, cell in polling.summary.items():
            lines.append(
                f"| {key} | {cell['lat_mean_us']} | {cell['lat_p50_us']} |"
                f" {cell['context_switches_per_io']} | {cell['cpu_sys_pct']} |"
            )
        (out / "lab_flash.md").write_text("\n".join(lines) + "\n")
        problems = fairness.kernel_problems + polling.kernel_problems
        record(
            "lab_flash",
            {**doc, "kernel_problem_count": len(problems)},
            {"kernel problems": "kernel_problem_count"},
        )
    return 0 if not doc["kernel_problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
