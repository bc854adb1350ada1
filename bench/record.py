"""Recording benchmark results with what produced them: the machine, the commit, the command."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "bench" / "results"


def provenance(script: str) -> dict[str, str]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "machine": f"{os.cpu_count()} cpu, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "commit": commit,
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python -m bench.{Path(script).stem} {shlex.join(sys.argv[1:])}".strip(),
    }


def record(name: str, result: dict[str, Any], columns: dict[str, str], out: Path = RESULTS) -> None:
    """OUT/NAME.json holds the latest run; NAME.md gains a row per run (OUT: bench/results by
    default).

    columns: header -> key in result; `when`, `commit` and `command` frame every row."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    table = out / f"{name}.md"
    headers = ["when", "commit", *columns, "command"]
    header = f"| {' | '.join(headers)} |\n|{'---|' * len(headers)}\n"
    if not table.exists():
        table.write_text(f"# {name} results\n\n{header}")
    else:
        heads = [line for line in table.read_text().splitlines() if line.startswith("| when |")]
        if not heads or heads[-1] != header.splitlines()[0]:
            with table.open("a") as md:  # the columns changed: a new table under the old rows
                md.write(f"\n{header}")
    cells = [result["when"], result["commit"], *(str(result[key]) for key in columns.values())]
    with table.open("a") as md:
        md.write(f"| {' | '.join(cells)} | `{result['command']}` |\n")
