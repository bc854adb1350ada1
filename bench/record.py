"""Recording benchmark results with what produced them: the machine, the commit, the command,
and how busy the host was while the figures were taken.

Every bench records through `record()`: the same record (command, commit, host and its load,
the figures by name) is appended to OUT/NAME.jsonl, OUT/NAME.json holds the latest full
result, and the table in OUT/NAME.md between its two markers is regenerated from the JSONL
(notes around the markers are kept). OUT is bench/results unless `python -m bench run --out
DIR` (or BLKPILOT_BENCH_OUT) names another; `--no-record` (BLKPILOT_BENCH_NO_RECORD=1) writes
nothing at all.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# the checkout's results: inputs some benches read (the measured grid, recorded evidence)
RESULTS = ROOT / "bench" / "results"

OUT_ENV = "BLKPILOT_BENCH_OUT"
NO_RECORD_ENV = "BLKPILOT_BENCH_NO_RECORD"
QUICK_ENV = "BLKPILOT_BENCH_QUICK"

# the host had less idle CPU than this over a run: its figures are flagged as taken on a busy
# host (and a bench whose method needs idle CPU refuses, bench.bpf_cost)
BUSY_IDLE_SHARE = 0.10

TABLE_BEGIN = "<!-- records: regenerated from {name}.jsonl by bench/record.py -->"
TABLE_END = "<!-- records: end -->"


def evidence_bundles(given: list[Path], latest: int | None = None) -> list[Path]:
    """The live canaries' evidence to replay: the files given, else every bundle bench.live_apps
    recorded (bench/results/live_apps_evidence), oldest first; only the newest `latest`."""
    bundles = given or sorted((RESULTS / "live_apps_evidence").glob("*.json.gz"))
    return bundles[-latest:] if latest else bundles


def out_dir() -> Path:
    """Where records go: BLKPILOT_BENCH_OUT, else bench/results."""
    given = os.environ.get(OUT_ENV)
    return Path(given).resolve() if given else RESULTS


def recording() -> bool:
    """False under --no-record (BLKPILOT_BENCH_NO_RECORD=1)."""
    return os.environ.get(NO_RECORD_ENV, "") not in ("1", "true", "yes")


def quick() -> bool:
    """True in the harness's quick mode (BLKPILOT_BENCH_QUICK=1): a look, too short to judge
    a target, and recorded as such."""
    return os.environ.get(QUICK_ENV, "") in ("1", "true", "yes")


@dataclass(frozen=True)
class CpuTimes:
    """/proc/stat's first line: all CPUs' time, and the idle part of it (idle + iowait)."""

    total: int
    idle: int

    @classmethod
    def now(cls) -> CpuTimes:
        with open("/proc/stat") as stat:
            fields = [int(f) for f in stat.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        return cls(total=sum(fields[:8]), idle=fields[3] + fields[4])


# the host's CPU times when this bench began (this module is imported at its start), or
# when the harness started it (BLKPILOT_BENCH_CPU0="total idle")
def _started() -> CpuTimes:
    given = os.environ.get("BLKPILOT_BENCH_CPU0", "").split()
    if len(given) == 2 and all(g.isdigit() for g in given):
        return CpuTimes(int(given[0]), int(given[1]))
    return CpuTimes.now()


STARTED = _started()


def host_load(since: CpuTimes | None = None) -> dict[str, Any]:
    """How busy the host was: the share of all CPU time that was idle since `since` (the
    bench's start by default), the load averages now, and `busy` where idle fell below
    BUSY_IDLE_SHARE — the figures were taken beside other work."""
    since = since or STARTED
    now = CpuTimes.now()
    spent = now.total - since.total
    idle_share = (now.idle - since.idle) / spent if spent > 0 else None
    load1, load5, _ = (float(v) for v in Path("/proc/loadavg").read_text().split()[:3])
    return {
        "cpus": os.cpu_count(),
        "idle_share": None if idle_share is None else round(idle_share, 3),
        "load1": load1,
        "load5": load5,
        "busy": idle_share is not None and idle_share < BUSY_IDLE_SHARE,
    }


def provenance(script: str) -> dict[str, str]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    name = Path(script).stem
    if name == "__main__":  # a bench that is a package: bench/partitions/__main__.py
        name = Path(script).parent.name
    return {
        "machine": f"{os.cpu_count()} cpu, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "commit": commit,
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python -m bench.{name} {shlex.join(sys.argv[1:])}".strip(),
    }


def record(
    name: str, result: dict[str, Any], columns: dict[str, str], out: Path | None = None
) -> Path | None:
    """Append this run's record to OUT/NAME.jsonl, keep the full result in OUT/NAME.json and
    regenerate NAME.md's table; nothing under --no-record. Returns the JSONL written.

    columns: header -> key in result (a header carries its unit: "p99 (µs)"); `when`,
    `commit`, the host's idle share and `command` frame every row."""
    if not recording():
        print(f"bench: {name} not recorded (--no-record)", file=sys.stderr)
        return None
    out = out or out_dir()
    out.mkdir(parents=True, exist_ok=True)
    host = result.get("host_load") or host_load()
    entry = {
        "name": name,
        "when": result["when"],
        "commit": result["commit"],
        "command": result["command"],
        "machine": result.get("machine", ""),
        "host": host,
        "quick": quick(),
        "figures": {header: result[key] for header, key in columns.items()},
    }
    if host["busy"]:
        print(
            f"bench: {name} ran on a busy host ({host['idle_share']:.0%} idle): its figures are"
            " flagged so in the record",
            file=sys.stderr,
        )
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    history = out / f"{name}.jsonl"
    with history.open("a") as lines:
        lines.write(json.dumps(entry, ensure_ascii=False) + "\n")
    write_table(name, out)
    return history


def records(name: str, out: Path | None = None) -> list[dict[str, Any]]:
    """Every record NAME.jsonl holds, oldest first."""
    history = (out or out_dir()) / f"{name}.jsonl"
    if not history.exists():
        return []
    return [json.loads(line) for line in history.read_text().splitlines() if line.strip()]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(entries: list[dict[str, Any]]) -> str:
    """The records as Markdown tables (a new header where the figures' names change)."""
    parts: list[str] = []
    headers: list[str] | None = None
    for entry in entries:
        names = list(entry["figures"])
        if names != headers:
            headers = names
            columns = ["when", "commit", *names, "host idle", "command"]
            parts.append(f"\n| {' | '.join(columns)} |\n|{'---|' * len(columns)}")
        idle = entry["host"].get("idle_share")
        flag = "" if idle is None else f"{idle:.0%}" + (" (busy)" if entry["host"]["busy"] else "")
        when = entry["when"] + (" (quick)" if entry.get("quick") else "")
        cells = [when, entry["commit"], *(_cell(entry["figures"][n]) for n in names)]
        command = f"`{entry['command']}`"
        parts.append(f"| {' | '.join([*cells, flag, command])} |")
    return "\n".join(parts).lstrip("\n")


def write_table(name: str, out: Path) -> None:
    """NAME.md's table regenerated from NAME.jsonl, between its markers (appended at the end
    the first time); whatever else the file holds is kept."""
    page = out / f"{name}.md"
    begin = TABLE_BEGIN.format(name=name)
    generated = f"{begin}\n\n{table(records(name, out))}\n\n{TABLE_END}"
    text = page.read_text() if page.exists() else f"# {name} results\n"
    if begin in text and TABLE_END in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(TABLE_END)
        text = head + generated + tail
    else:
        text = text.rstrip("\n") + "\n\n## Records\n\n" + generated + "\n"
    page.write_text(text)
