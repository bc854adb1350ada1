"""Live canary quality on devices that hold data: how often an A/A live canary fails (the
false-fail rate), how often it catches a large regression and a smaller one, and the seconds
of traffic each verdict takes — quiet, or with one core kept busy by a CPU hog.

Devices: loop devices holding ext4 with files (kernel.lab.devices.data_device), one backed by
tmpfs and one by a file on disk, each with fio reading 4 KiB blocks of a file in it (psync,
queue depth 1) as the production traffic for the whole run. The regressions, measured here:
- large: bfq on the tmpfs-backed device (about +25 % at p50);
- small: bfq on the disk-backed device (about +14 % at p50, +20 % at p99), the nearest to 10 %
  found among the stock schedulers (mq-deadline and kyber cost it 5-7 %).
A/A canaries alternate between the two devices; every canary's verdict, shifts and seconds are
kept. Records the result, with the command that reproduces it, in bench/results/live_canary.*

    python -m bench.live_canary                      # 12 A/A, 6 large, 6 small; quiet
    python -m bench.live_canary --hog                # the same with a CPU hog on core 0
    python -m bench.live_canary --aa 40 --regressions 20
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
from agent.collectors.blklat import BlkLatCollector
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.host import HostPaths
from agent.live_canary import LiveSettings, run_live_canary
from bench.record import provenance, quick, record
from bench.unwind import on_termination
from kernel.lab.devices import TMPFS, data_device, start_workload, stop_workload

DISK = Path("/var/tmp")  # noqa: S108 (a file on disk, never a device)
TARGET_FALSE_FAIL = 0.05
TARGET_DETECTION = 0.95


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--aa", type=int, default=12, help="A/A canaries")
    parser.add_argument("--regressions", type=int, default=6, help="of each regression")
    parser.add_argument("--hog", action="store_true", help="a CPU hog on core 0 throughout")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    # a stopped run still stops the applications and unmounts and detaches its devices
    on_termination()
    settings = LiveSettings()
    started = provenance("live_canary.py")  # the commit this run's code came from
    work = Path(tempfile.mkdtemp(prefix="blkpilot-live-bench-"))
    hog = (
        subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
        if args.hog
        else None
    )
    runs: list[dict[str, object]] = []
    collector = BlkLatCollector(HostPaths())
    if not collector.available:
        print(f"eBPF unavailable: {collector.unavailable}", file=sys.stderr)
        return 2
    try:
        with (
            data_device(TMPFS / "blkpilot-live-bench-tmpfs.img", 512 << 20, work / "tmpfs") as fast,
            data_device(DISK / "blkpilot-live-bench-disk.img", 512 << 20, work / "disk") as slow,
        ):
            workloads = [
                start_workload(d.data_file, iodepth=1, engine="psync", device=d.name)
                for d in (fast, slow)
            ]
            applier = Applier(HostPaths(), work / "agent")
            plan = [("aa", fast if i % 2 == 0 else slow) for i in range(args.aa)]
            plan += [("large", fast)] * args.regressions + [("small", slow)] * args.regressions
            candidates = {
                "aa": DeviceConfig(scheduler=Scheduler.NONE),
                "large": DeviceConfig(scheduler=Scheduler.BFQ),
                "small": DeviceConfig(scheduler=Scheduler.BFQ),
            }
            order = sorted(range(len(plan)), key=lambda i: (i % 3, i))  # interleave the kinds
            try:
                for number, index in enumerate(order, 1):
                    kind, device = plan[index]
                    result, report, _ = run_live_canary(
                        applier, device.name, candidates[kind], collector, settings
                    )
                    if result.kept_candidate:
                        applier.rollback(device.name)
                    shifts = {s.metric: round(s.relative_shift, 4) for s in result.per_metric}
                    runs.append(
                        {
                            "kind": kind,
                            "device": "tmpfs" if device is fast else "disk",
                            "verdict": result.verdict.value,
                            "guard": bool(report.guard_tripped),
                            "traffic_s": round(report.traffic_seconds, 1),
                            "wall_s": round(result.seconds, 1),
                            "pairs_set_aside": report.pairs_set_aside,
                            **shifts,
                        }
                    )
                    print(f"{number:3} {json.dumps(runs[-1])}", flush=True)
            finally:
                for process in workloads:
                    stop_workload(process)
        problems = [d.fsck for d in (fast, slow) if d.fsck]
        problems += ["files changed" for d in (fast, slow) if not d.files_intact]
    finally:
        collector.close()
        if hog is not None:
            hog.kill()
            hog.wait()
    if problems:
        print(f"the data devices were harmed: {problems}", file=sys.stderr)
        return 3

    def share(kind: str, verdict: str) -> float:
        mine = [r for r in runs if r["kind"] == kind]
        return sum(r["verdict"] == verdict for r in mine) / len(mine) if mine else 0.0

    def median(kind: str, key: str) -> float | None:
        values = [float(r[key]) for r in runs if r["kind"] == kind and key in r]  # type: ignore[arg-type]
        return round(statistics.median(values), 3) if values else None

    result_doc = {
        "benchmark": "live_canary",
        "condition": "CPU hog on core 0" if args.hog else "quiet",
        "aa_canaries": args.aa,
        "false_fail_rate": round(share("aa", "fail"), 3),
        "aa_pass_rate": round(share("aa", "pass"), 3),
        "target_false_fail_rate": TARGET_FALSE_FAIL,
        "large_detection_rate": round(share("large", "fail"), 3),
        "target_detection_rate": TARGET_DETECTION,
        "large_p50_shift_median": median("large", "lat_p50_us"),
        "small_detection_rate": round(share("small", "fail"), 3),
        "small_pass_rate": round(share("small", "pass"), 3),
        "small_p50_shift_median": median("small", "lat_p50_us"),
        "small_p99_shift_median": median("small", "lat_p99_us"),
        "traffic_s_per_verdict_median": round(
            statistics.median(float(str(r["traffic_s"])) for r in runs), 1
        ),
        "pairs": settings.pairs,
        "interval_s": settings.interval_s,
        "tolerances": {r.metric: r.tolerance for r in settings.judged()},
        "runs": runs,
        **started,
    }
    print(json.dumps({k: v for k, v in result_doc.items() if k != "runs"}, indent=2))
    if not args.no_record:
        record(
            "live_canary",
            result_doc,
            {
                "condition": "condition",
                "A/A false-fail": "false_fail_rate",
                "A/A pass": "aa_pass_rate",
                "large (bfq, tmpfs) detected": "large_detection_rate",
                "small (bfq, disk) detected": "small_detection_rate",
                "small p50 shift": "small_p50_shift_median",
                "traffic s/verdict": "traffic_s_per_verdict_median",
                "A/A runs": "aa_canaries",
            },
        )
    ok = share("aa", "fail") <= TARGET_FALSE_FAIL and share("large", "fail") >= TARGET_DETECTION
    print(f"{'PASS' if ok else 'OFF TARGET'}: {result_doc['condition']}")
    # a quick look is too short to judge the target: it says where it stands, and succeeds
    return 0 if ok or quick() else 1


if __name__ == "__main__":
    sys.exit(main())
