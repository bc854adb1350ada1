"""Canary quality: how often an A/A canary (candidate = baseline) fails — the false-fail rate —
and how often a canary of bfq against none catches bfq's known cost on a tmpfs-backed loop
device — the detection rate — with the wall time per verdict.

Every canary runs on its own fresh lab device (tmpfs, empty), A/A and bfq alternating so that
both see the same machine. Records the result, with the command that reproduces it, in
bench/results/canary.*

    python -m bench.canary                          # 20 A/A + 20 bfq, 8 rounds of 0.5 s
    python -m bench.canary --canaries 50 --rounds 10 --round-seconds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from agent.applier import Applier
from agent.bench.library import library
from agent.canary import run_canary
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.wire import CanaryVerdict
from agent.host import HostPaths
from bench.record import provenance, record
from kernel.lab import devices as lab

ROOT = Path(__file__).resolve().parent.parent

TARGET_FALSE_FAIL = 0.05
TARGET_DETECTION = 0.95


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--canaries", type=int, default=20, help="of each kind")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round-seconds", type=float, default=0.5)
    parser.add_argument("--workload", default="hs23-single-randread-4k-qd1")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    workload = library()[args.workload]
    work = Path(tempfile.mkdtemp(prefix="blkpilot-canary-"))
    verdicts: dict[str, list[str]] = {"aa": [], "bfq": []}
    seconds: list[float] = []
    shifts: list[float] = []
    candidates = {
        "aa": DeviceConfig(scheduler=Scheduler.NONE),
        "bfq": DeviceConfig(scheduler=Scheduler.BFQ),
    }
    for i in range(args.canaries):
        for kind, candidate in candidates.items():
            backing = lab.TMPFS / f"blkpilot-canary-bench-{i}-{kind}.img"
            with lab.lab_devices({"dev": (backing, 256 << 20)}) as devices:
                device = devices["dev"]
                result = run_canary(
                    Applier(HostPaths(), work / "agent"),
                    device,
                    workload,
                    candidate,
                    workdir=work / "bench",
                    rounds=args.rounds,
                    round_seconds=args.round_seconds,
                )
                after = Path(f"/sys/block/{device}/queue/scheduler").read_text()
                if result.verdict is not CanaryVerdict.PASS:
                    assert "[none]" in after, f"{device} not restored: {after}"
            verdicts[kind].append(result.verdict.value)
            seconds.append(result.seconds)
            if kind == "bfq":
                shifts.append(
                    next(s.relative_shift for s in result.per_metric if s.metric == "iops")
                )
            print(
                f"{i + 1:3} {kind:3} {result.verdict.value:12} {result.seconds:5.1f} s", flush=True
            )

    false_fail = verdicts["aa"].count("fail") / len(verdicts["aa"])
    detection = verdicts["bfq"].count("fail") / len(verdicts["bfq"])
    result_doc = {
        "benchmark": "canary",
        "aa_canaries": len(verdicts["aa"]),
        "aa_verdicts": {v: verdicts["aa"].count(v) for v in ("pass", "inconclusive", "fail")},
        "false_fail_rate": round(false_fail, 3),
        "target_false_fail_rate": TARGET_FALSE_FAIL,
        "bfq_canaries": len(verdicts["bfq"]),
        "bfq_verdicts": {v: verdicts["bfq"].count(v) for v in ("pass", "inconclusive", "fail")},
        "detection_rate": round(detection, 3),
        "target_detection_rate": TARGET_DETECTION,
        "bfq_iops_shift_median": round(statistics.median(shifts), 3),
        "seconds_per_verdict_median": round(statistics.median(seconds), 1),
        "seconds_per_verdict_max": round(max(seconds), 1),
        "rounds": args.rounds,
        "round_seconds": args.round_seconds,
        "workload": args.workload,
        **provenance("canary.py"),
    }
    print(json.dumps(result_doc, indent=2))
    if not args.no_record:
        record(
            "canary",
            result_doc,
            {
                "A/A false-fail": "false_fail_rate",
                "bfq detection": "detection_rate",
                "s/verdict": "seconds_per_verdict_median",
                "canaries each": "aa_canaries",
                "rounds": "rounds",
            },
        )
    ok = false_fail <= TARGET_FALSE_FAIL and detection >= TARGET_DETECTION
    print(
        f"{'PASS' if ok else 'OFF TARGET'}: false-fail {false_fail:.0%}, detection {detection:.0%}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
