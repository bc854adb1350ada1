"""Canary quality: how often an A/A canary (candidate = baseline) fails — the false-fail rate —
how often a canary of bfq against none catches bfq's known cost — the detection rate — and how
often a good change (none against bfq) is kept, with the rounds and the wall time per verdict,
on tmpfs-backed loop devices. The canary is the sequential one: a first look after --rounds,
more rounds while inconclusive up to --max-rounds.

Every canary runs on its own fresh lab device (tmpfs, empty), the kinds alternating so that all
see the same machine. Records the result, with the command that reproduces it, in
bench/results/canary.*

    python -m bench.canary                          # 10 of each kind, 8 rounds of 0.5 s, up to 24
    python -m bench.canary --hog                    # the same with a CPU hog on core 0
    python -m bench.canary --canaries 20 --workload hs23-single-randread-4k-qd32
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from agent.applier import Applier
from agent.bench.library import library
from agent.canary import run_canary
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.wire import CanaryVerdict
from agent.host import HostPaths
from bench.record import provenance, quick, record
from bench.unwind import on_termination
from kernel.lab import devices as lab

TARGET_FALSE_FAIL = 0.05
TARGET_DETECTION = 0.95

# kind: (the device's configuration before, the candidate, the verdict a good canary gives)
KINDS = {
    "aa": (Scheduler.NONE, Scheduler.NONE, None),  # anything but fail
    "bfq": (Scheduler.NONE, Scheduler.BFQ, CanaryVerdict.FAIL),
    "good": (Scheduler.BFQ, Scheduler.NONE, CanaryVerdict.PASS),
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--canaries", type=int, default=10, help="of each kind")
    parser.add_argument("--rounds", type=int, default=8, help="before the first look")
    parser.add_argument("--max-rounds", type=int, default=None, help="default 3 x --rounds")
    parser.add_argument("--round-seconds", type=float, default=0.5)
    parser.add_argument("--workload", default="hs23-single-randread-4k-qd1")
    parser.add_argument("--hog", action="store_true", help="a CPU hog on core 0 throughout")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    started = provenance("canary.py")
    workload = library()[args.workload]
    on_termination()  # a stopped run still removes what it started
    work = Path(tempfile.mkdtemp(prefix="blkpilot-canary-"))
    verdicts: dict[str, list[str]] = {kind: [] for kind in KINDS}
    rounds: dict[str, list[int]] = {kind: [] for kind in KINDS}
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    shifts: list[float] = []
    hog = (
        subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
        if args.hog
        else None
    )
    try:
        for i in range(args.canaries):
            for kind, (before, candidate, _) in KINDS.items():
                backing = lab.TMPFS / f"blkpilot-canary-bench-{i}-{kind}.img"
                with lab.lab_devices({"dev": (backing, 256 << 20)}) as devices:
                    device = devices["dev"]
                    scheduler = Path(f"/sys/block/{device}/queue/scheduler")
                    scheduler.write_text(before.value)
                    result = run_canary(
                        Applier(HostPaths(), work / "agent"),
                        device,
                        workload,
                        DeviceConfig(scheduler=candidate),
                        workdir=work / "bench",
                        rounds=args.rounds,
                        max_rounds=args.max_rounds,
                        round_seconds=args.round_seconds,
                    )
                    after = scheduler.read_text()
                    if result.verdict is not CanaryVerdict.PASS:
                        assert f"[{before.value}]" in after, f"{device} not restored: {after}"
                verdicts[kind].append(result.verdict.value)
                rounds[kind].append(result.rounds)
                seconds[kind].append(result.seconds)
                if kind == "bfq":
                    shifts.append(
                        next(s.relative_shift for s in result.per_metric if s.metric == "iops")
                    )
                print(
                    f"{i + 1:3} {kind:4} {result.verdict.value:12} {result.rounds:3} rounds"
                    f" {result.seconds:5.1f} s",
                    flush=True,
                )
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()

    def counts(kind: str) -> dict[str, int]:
        return {v: verdicts[kind].count(v) for v in ("pass", "inconclusive", "fail")}

    n = args.canaries
    false_fail = verdicts["aa"].count("fail") / n
    detection = verdicts["bfq"].count("fail") / n
    kept = verdicts["good"].count("pass") / n
    every = [s for kind in KINDS for s in seconds[kind]]
    result_doc = {
        "benchmark": "canary",
        "condition": "CPU hog on core 0" if args.hog else "quiet",
        "canaries_each": n,
        "aa_verdicts": counts("aa"),
        "false_fail_rate": round(false_fail, 3),
        "target_false_fail_rate": TARGET_FALSE_FAIL,
        "aa_pass_rate": round(verdicts["aa"].count("pass") / n, 3),
        "bfq_verdicts": counts("bfq"),
        "detection_rate": round(detection, 3),
        "target_detection_rate": TARGET_DETECTION,
        "bfq_iops_shift_median": round(statistics.median(shifts), 3),
        "good_verdicts": counts("good"),
        "good_kept_rate": round(kept, 3),
        "rounds_median": {kind: statistics.median(rounds[kind]) for kind in KINDS},
        "seconds_per_verdict_median": round(statistics.median(every), 1),
        "seconds_per_verdict_max": round(max(every), 1),
        "rounds": args.rounds,
        "max_rounds": args.max_rounds or 3 * args.rounds,
        "round_seconds": args.round_seconds,
        "workload": args.workload,
        **started,
    }
    print(json.dumps(result_doc, indent=2))
    if not args.no_record:
        record(
            "canary",
            result_doc,
            {
                "condition": "condition",
                "A/A false-fail": "false_fail_rate",
                "A/A pass": "aa_pass_rate",
                "bfq detection": "detection_rate",
                "good kept": "good_kept_rate",
                "s/verdict": "seconds_per_verdict_median",
                "canaries each": "canaries_each",
                "rounds (budget)": "max_rounds",
            },
        )
    ok = false_fail <= TARGET_FALSE_FAIL and detection >= TARGET_DETECTION
    print(
        f"{'PASS' if ok else 'OFF TARGET'}: false-fail {false_fail:.0%}, detection"
        f" {detection:.0%}, good kept {kept:.0%}"
    )
    # a quick look is too short to judge the target: it says where it stands, and succeeds
    return 0 if ok or quick() else 1


if __name__ == "__main__":
    sys.exit(main())
