"""The ground-truth grid for `blkpilot eval`: every candidate configuration of the policy
search (models.search.candidates), measured, repeated, on each device and workload.

Devices: both kinds of host loop device (a file on tmpfs: memory speed; a file on disk
with direct I/O: the disk's speed) with the host's four stock schedulers, and the kernel
lab's test device (flashsim under Debian 6.1 in QEMU) at a ULL and a flash latency with poll
queues, where fios is loaded and interrupt, classic and hybrid polling are configurations.
Workloads: bench.grid.GRID_WORKLOADS. Each repeat runs the configurations in a fresh order.

    python -m bench.policy_grid --host                 # loop devices, 3 repeats of 0.8 s runs
    python -m bench.policy_grid --lab                  # lab devices, 2 repeats of 1 s runs
    python -m bench.policy_grid --host --lab           # both
    python -m bench.policy_grid --lab --device lab-nullblk --workload fios-1r1w  # a part of it

Writes bench/results/policy_grid_runs.json.gz (the cells measured here replace earlier runs of
the same cells; every other cell is kept) and a line per part in bench/results/policy_grid.md.

The wider grid (issue 33 item 3: devices whose features vary, for leave-one-device-out) keeps
its added devices in a file of its own, so that what the demo and the suite train on stays
the 7 devices above; `bench.policy_eval --grid A --grid B` judges both as one:

    python -m bench.policy_grid --lab --device lab-nullblk-100us \
        --out bench/results/policy_grid_wide_runs.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.grid import grid_workloads
from bench.grid.host import measure_host_grid
from bench.record import RESULTS, out_dir, provenance, record
from bench.unwind import on_termination
from kernel.lab import devices as lab
from models.grid import Grid

ROOT = Path(__file__).resolve().parent.parent

RESULT = ROOT / "bench" / "results" / "policy_grid_runs.json.gz"
HOST_DEVICES = {  # grid name -> (where the backing file lives, size)
    "host-loop-tmpfs": (lab.TMPFS, 512 << 20),
    "host-loop-disk": (Path("/var/tmp"), 512 << 20),  # noqa: S108 (a file, never a device)
}


def load_existing(path: Path = RESULT) -> Grid:
    if not path.exists():
        return Grid()
    with gzip.open(path, "rt") as handle:
        return Grid.from_json(json.load(handle))


def save(grid: Grid, path: Path = RESULT) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as handle:
        json.dump(grid.to_json(), handle, separators=(",", ":"))
    tmp.replace(path)


def host_grid(
    repeats: int, seconds: float, seed: int, devices: set[str] | None, workloads: set[str] | None
) -> Grid:
    work = Path(tempfile.mkdtemp(prefix="blkpilot-grid-"))
    specs = {
        label: (where / f"blkpilot-grid-{label}.img", size)
        for label, (where, size) in HOST_DEVICES.items()
        if devices is None or label in devices
    }
    with lab.lab_devices(specs) as made:
        return measure_host_grid(
            {
                label: (name, f"host loop device on {HOST_DEVICES[label][0]}")
                for label, name in made.items()
            },
            [
                w
                for w in grid_workloads(seconds, warmup_s=0.2)
                if workloads is None or w.name in workloads
            ],
            repeats=repeats,
            work=work,
            seed=seed,
            progress=lambda line: print(line, flush=True),
        )


def lab_grid(
    repeats: int, seconds: float, seed: int, devices: set[str] | None, workloads: set[str] | None
) -> Grid:
    from bench.grid.lab import LAB_DEVICES, run_grid

    return run_grid(
        repeats=repeats,
        seconds=seconds,
        seed=seed,
        devices={k: v for k, v in LAB_DEVICES.items() if devices is None or k in devices},
        workload_names=None if workloads is None else tuple(workloads),
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--host", action="store_true")
    parser.add_argument("--lab", action="store_true")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", action="append", help="only this device (repeatable)")
    parser.add_argument("--workload", action="append", help="only this workload (repeatable)")
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULT,
        help="the grid file to grow (default: the main grid; a grid in the harness's --out)",
    )
    args = parser.parse_args()
    if args.out == RESULT and out_dir() != RESULTS:  # the harness's --out: never the checkout
        args.out = out_dir() / RESULT.name
    if not (args.host or args.lab):
        parser.error("give --host, --lab or both")
    on_termination()  # a stopped run still detaches its devices
    from bench.grid import GRID_WORKLOADS
    from bench.grid.lab import LAB_DEVICES

    unknown = set(args.device or ()) - set(HOST_DEVICES) - set(LAB_DEVICES)
    unknown |= set(args.workload or ()) - set(GRID_WORKLOADS)
    if unknown:
        parser.error(f"unknown device or workload: {', '.join(sorted(unknown))}")
    devices = set(args.device) if args.device else None
    workloads = set(args.workload) if args.workload else None
    parts = [("host", host_grid, 3, 0.8)] if args.host else []
    parts += [("lab", lab_grid, 2, 1.0)] if args.lab else []
    for part, measure_part, repeats, seconds in parts:
        started = time.monotonic()
        if devices is not None and not devices & set(
            HOST_DEVICES if part == "host" else LAB_DEVICES
        ):
            continue
        measured = measure_part(
            args.repeats or repeats, args.seconds or seconds, args.seed, devices, workloads
        )
        # read now, not at the start: another part may have been recorded meanwhile; the
        # cells measured now replace what an earlier run recorded of them
        grid = load_existing(args.out)
        fresh = set(measured.cells())
        grid.runs = [r for r in grid.runs if (r.device, r.workload) not in fresh]
        recorded = {
            **provenance("policy_grid.py"),
            "repeats": args.repeats or repeats,
            "seconds": args.seconds or seconds,
            "minutes": round((time.monotonic() - started) / 60, 1),
            "cells": [list(c) for c in sorted(fresh)],
            **measured.meta,
        }
        # every part recorded keeps its provenance (a grid grows by parts over several runs)
        earlier = grid.meta.get(part, [])
        grid.meta[part] = [*(earlier if isinstance(earlier, list) else [earlier]), recorded]
        grid.merge(measured)
        save(grid, args.out)
        cells = sorted(fresh)
        configs = min(len(grid.configs(*cell)) for cell in cells)
        doc = {
            "benchmark": "policy_grid",
            "part": part,
            "devices": ", ".join(sorted(measured.devices)),
            "cells": len(cells),
            "min_configs_per_cell": configs,
            "runs": len(measured.runs),
            **{k: v for k, v in recorded.items() if k != "cells"},
        }
        print(json.dumps(doc, indent=2))
        record(
            "policy_grid",
            doc,
            {
                "part": "part",
                "devices": "devices",
                "cells": "cells",
                "configs/cell": "min_configs_per_cell",
                "runs": "runs",
                "minutes": "minutes",
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
