"""A real application against writers (issue 36), in the kernel lab (Debian 6.1 under QEMU TCG,
two vCPUs, flashsim striped with a hardware queue per vCPU): RocksDB's db_bench reading its
database at random (the library's rocksdb-readrandom: 4 KB values, direct reads) on ext4,
against the review's four 4 KiB writers writing a file of their own on the same filesystem,
under none, mq-deadline, bfq and fios (calibrated in a boot of its own, the review's 20 ms
slices), in `--boots` fresh boots.

Per scheduler and boot, db_bench's own figures — reads a second and p99 latency, alone and
against the writers — and the fairness between the two sides as FIOS measures it: each side's
slowdown over its proportional one (the reader 5, the four writers together 5/4) and the
concurrent efficiency (the reader's reads over alone plus the writers' writes over alone).

TCG inflates every absolute number (db_bench's CPU per read most): compare within a boot.
Records bench/results/lab_fios_rocksdb.*

    python -m bench.lab_fios_rocksdb                    # 3 boots, 10 s runs
    python -m bench.lab_fios_rocksdb --boots 1 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from bench.record import provenance, record
from kernel.lab.scenarios import ROCKSDB_SCHEDULERS, run


def across_boots(boots: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scheduler, each figure's median over the boots (and every boot's, to see the
    spread); fios' efficiency over mq-deadline's and bfq's in each boot."""
    found: dict[str, Any] = {}
    for scheduler in ROCKSDB_SCHEDULERS:
        cases = [b[scheduler] for b in boots]
        found[scheduler] = {
            key: {
                "median": statistics.median(c[key] for c in cases),
                "per_boot": [c[key] for c in cases],
            }
            for key in (
                "reader_over_proportional",
                "writers_over_proportional",
                "worst_over_proportional",
                "concurrent_efficiency",
            )
        }
        found[scheduler]["reads_per_s_together"] = [c["reads_per_s"]["together"] for c in cases]
        found[scheduler]["read_p99_us_together"] = [c["read_p99_us"]["together"] for c in cases]
    for other in ("mq-deadline", "bfq"):
        found[f"fios_efficiency_over_{other.replace('-', '_')}"] = [
            round(b["fios"]["concurrent_efficiency"] / b[other]["concurrent_efficiency"], 3)
            for b in boots
        ]
        found[f"fios_reads_over_{other.replace('-', '_')}"] = [
            round(b["fios"]["reads_per_s"]["together"] / b[other]["reads_per_s"]["together"], 2)
            for b in boots
        ]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--boots", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    boots, problems, epochs = [], [], []
    for index in range(args.boots):
        result = run("flash-rocksdb-smp2", seconds=args.seconds)
        found = result.summary["rocksdb"]
        print(f"boot {index + 1}: {json.dumps(found)}", file=sys.stderr, flush=True)
        boots.append(found)
        problems += result.kernel_problems
        stats = next(v for k, v in result.stats.items() if k.endswith("/fios/together"))
        epochs.append(int(stats["epochs"]))
    summary = across_boots(boots)
    doc = {
        "benchmark": "lab_fios_rocksdb",
        "schedulers": list(ROCKSDB_SCHEDULERS),
        "boots": boots,
        "summary": summary,
        "worst_over_proportional_median": {
            s: summary[s]["worst_over_proportional"]["median"] for s in ROCKSDB_SCHEDULERS
        },
        "reader_over_proportional_median": {
            s: summary[s]["reader_over_proportional"]["median"] for s in ROCKSDB_SCHEDULERS
        },
        "efficiency_median": {
            s: summary[s]["concurrent_efficiency"]["median"] for s in ROCKSDB_SCHEDULERS
        },
        **{k: v for k, v in summary.items() if k.startswith("fios_")},
        "fios_epochs": epochs,
        "kernel_problems": problems,
        "seconds": args.seconds,
        **provenance("lab_fios_rocksdb.py"),
    }
    print(json.dumps(doc, indent=2))
    if not args.no_record:
        record(
            "lab_fios_rocksdb",
            doc,
            {
                "worst side / proportional (median)": "worst_over_proportional_median",
                "db_bench / proportional (median)": "reader_over_proportional_median",
                "concurrent efficiency (median)": "efficiency_median",
                "fios reads/s over mq-deadline's, per boot": "fios_reads_over_mq_deadline",
                "fios efficiency over mq-deadline's, per boot": "fios_efficiency_over_mq_deadline",
                "fios efficiency over bfq's, per boot": "fios_efficiency_over_bfq",
                "fios epochs": "fios_epochs",
            },
        )
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
