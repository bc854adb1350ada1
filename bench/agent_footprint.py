"""Agent footprint: CPU and resident memory of `blkpilot agent run` with 16 devices at a
1-second interval, reporting to a real service (embedded PostgreSQL) over loopback.

Creates 16 lab loop devices (tmpfs, 16 MiB each, empty), enrolls a node, runs the agent as
its own process, lets it warm up, then measures its CPU time (utime + stime from
/proc/PID/stat, all threads) over the measuring window and samples VmRSS every second.
Light read I/O runs on the devices throughout, so every window has something in it.
Records the result, with the command that reproduces it, in bench/results/agent_footprint.*

    python -m bench.agent_footprint                  # 60 s measured after 15 s warm-up
    python -m bench.agent_footprint --seconds 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from agent.enrollment import enroll_node
from bench.record import provenance, record
from kernel.lab import devices as lab
from tests.proc import BLKPILOT, clean_env, free_port, run, start_serve, stop, wait_ready

ROOT = Path(__file__).resolve().parent.parent

TARGET_CPU_PERCENT = 1.0  # of one core
TARGET_RSS_MB = 60.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="blkpilot-footprint-"))
    env = clean_env(work / "service")
    (work / "service").mkdir()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_serve(work / "service", env, port)
    specs = {
        f"d{i}": (lab.TMPFS / f"blkpilot-footprint-{port}-{i}.img", 16 << 20)
        for i in range(args.devices)
    }
    try:
        wait_ready(f"{base}/readyz", server, timeout=90)
        admin = run(
            "token", "create", "--name", "bench", "--role", "admin", env=env
        ).stdout.split()[-1]
        token = httpx.post(
            f"{base}/api/v1/enrollment-tokens",
            json={},
            headers={"Authorization": f"Bearer {admin}"},
        ).json()["token"]
        enroll_node(base, token, work / "agent", hostname="footprint", labels={})
        with lab.lab_devices(specs) as devices:
            command = [
                BLKPILOT,
                "agent",
                "run",
                "--state-dir",
                str(work / "agent"),
                "--interval",
                str(args.interval),
                "--metrics-port",
                "0",
                *[a for d in sorted(devices.values()) for a in ("--device", d)],
            ]
            agent = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
            )
            reader = (
                "while :; do dd if=/dev/{} of=/dev/null bs=4k count=256 iflag=direct"
                " status=none; sleep 0.5; done"
            )
            load = [subprocess.Popen(["sh", "-c", reader.format(d)]) for d in devices.values()]
            try:
                time.sleep(args.warmup)
                cpu0, wall0 = cpu_seconds(agent.pid), time.monotonic()
                peak = 0.0
                while time.monotonic() - wall0 < args.seconds:
                    time.sleep(1.0)
                    peak = max(peak, rss_mb(agent.pid))
                cpu1, wall1 = cpu_seconds(agent.pid), time.monotonic()
                final_rss = rss_mb(agent.pid)
            finally:
                for process in load:
                    process.terminate()
                    process.wait()
                stop(agent)
        devices_known = httpx.get(
            f"{base}/api/v1/devices", headers={"Authorization": f"Bearer {admin}"}
        ).json()
    finally:
        stop(server)

    cpu_percent = 100 * (cpu1 - cpu0) / (wall1 - wall0)
    result = {
        "benchmark": "agent_footprint",
        "cpu_percent_of_one_core": round(cpu_percent, 3),
        "target_cpu_percent": TARGET_CPU_PERCENT,
        "peak_rss_mb": round(peak, 1),
        "final_rss_mb": round(final_rss, 1),
        "target_rss_mb": TARGET_RSS_MB,
        "devices": args.devices,
        "devices_reported_to_service": len(devices_known),
        "interval_s": args.interval,
        "measured_s": round(wall1 - wall0, 1),
        "cpu_time_resolution_s": 1 / os.sysconf("SC_CLK_TCK"),
        **provenance("agent_footprint.py"),
    }
    print(json.dumps(result, indent=2))
    assert result["devices_reported_to_service"] == args.devices
    if not args.no_record:
        record(
            "agent_footprint",
            result,
            {
                "CPU % of one core": "cpu_percent_of_one_core",
                "peak RSS MB": "peak_rss_mb",
                "devices": "devices",
                "measured s": "measured_s",
            },
        )
    ok = cpu_percent <= TARGET_CPU_PERCENT and peak <= TARGET_RSS_MB
    print(f"{'PASS' if ok else 'OVER TARGET'}: {cpu_percent:.2f} % CPU, {peak:.1f} MB peak RSS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
