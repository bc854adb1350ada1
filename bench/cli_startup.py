"""How long `blkpilot --help` (and a subcommand's --help) takes: an operator's first contact
with the CLI, and every tab-completion's cost. Each command is run `--runs` times; recorded are
the median wall time and the median CPU time of the process (user + system, from
resource.getrusage of the children — the figure that holds on a busy host). Target: under
0.5 s on a quiet machine (issue 34).

    python -m bench.cli_startup                 # 10 runs of each
    python -m bench.cli_startup --runs 30 --no-record
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.record import provenance, record

BLKPILOT = str(Path(sys.executable).parent / "blkpilot")
COMMANDS = [["--help"], ["recommendations", "list", "--help"], ["agent", "status", "--help"]]
TARGET_S = 0.5


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([BLKPILOT, *argv], capture_output=True, check=True, timeout=120)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    timed(["--help"])  # the page cache warmed, as on a machine in use
    for argv in COMMANDS:
        runs = [timed(argv) for _ in range(args.runs)]
        result = {
            **provenance(__file__),
            "cli": "blkpilot " + " ".join(argv),
            "runs": args.runs,
            "wall_s_median": round(statistics.median(w for w, _ in runs), 3),
            "cpu_s_median": round(statistics.median(c for _, c in runs), 3),
            "target_s": TARGET_S,
        }
        print(json.dumps(result))
        if not args.no_record:
            record(
                "cli_startup",
                result,
                {
                    "command line": "cli",
                    "runs": "runs",
                    "wall s (median)": "wall_s_median",
                    "CPU s (median)": "cpu_s_median",
                    "target s": "target_s",
                },
            )


if __name__ == "__main__":
    main()
