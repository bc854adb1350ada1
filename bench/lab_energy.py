"""HotStorage '22's question — polling or interrupts, for energy — in the kernel lab, where no
meter exists: energy estimated from the guest's CPU time (agent.power.CpuPowerModel, scope
estimated), beside latency, IOPS and context switches. flashsim at a ULL-like (5 µs) and a
flash-like (80 µs) read latency, QD1 io_uring reads of 4 KiB and 128 KiB, interrupts, classic
and hybrid polling, rounds in the same boot. TCG inflates the guest's CPU cost per request:
compare modes within a run.

    python -m bench.lab_energy --rounds 3

Records bench/results/lab_energy.json and a row per device, size and mode in lab_energy.md.
"""

from __future__ import annotations

import argparse
import sys

from bench.record import provenance, record
from kernel.lab.scenarios import run


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    polling = run("flash-polling", rounds=args.rounds, seconds=args.seconds)
    if polling.kernel_problems:
        print(polling.kernel_problems, file=sys.stderr)
        return 1
    summary = polling.summary
    for key, cell in summary.items():
        device, size, mode = key.split("/")
        irq = summary[f"{device}/{size}/interrupt"]
        doc = {
            "benchmark": "lab_energy",
            "kernel": polling.kernel,
            "device": device,
            "size": size,
            "mode": mode,
            "rounds": args.rounds,
            **cell,
            "energy_over_interrupt": round(
                cell["joules_per_mio_estimated"] / irq["joules_per_mio_estimated"], 3
            ),
            "latency_over_interrupt": round(cell["lat_mean_us"] / irq["lat_mean_us"], 3),
            **provenance("lab_energy.py"),
        }
        record(
            "lab_energy",
            doc,
            {
                "device": "device",
                "size": "size",
                "mode": "mode",
                "rounds": "rounds",
                "mean µs": "lat_mean_us",
                "IOPS": "iops",
                "ctx switches per I/O": "context_switches_per_io",
                "CPU busy": "cpu_busy_share",
                "J per MIO (estimated)": "joules_per_mio_estimated",
                "energy / interrupt": "energy_over_interrupt",
                "latency / interrupt": "latency_over_interrupt",
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
