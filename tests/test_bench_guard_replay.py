"""The guard replayed on the live canaries bench.live_apps recorded (pgbench and db_bench,
quiet and beside a CPU hog): with its tail as it is now, no A/A is ended, and a pgbench run
under bfq that the former tail (the largest baseline interval p99) let run is ended."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from agent.live_judge import LiveSettings, baseline_tail_us
from bench.guard_replay import ends, largest

EVIDENCE = Path(__file__).parent.parent / "bench" / "results" / "live_apps_evidence"


def runs(pattern: str) -> list[dict[str, Any]]:
    found = []
    for bundle in sorted(EVIDENCE.glob(pattern)):
        found += json.loads(gzip.decompress(bundle.read_bytes()))
    return [r for r in found if "latency" in r["evidence"]]


def test_no_recorded_a_to_a_is_ended() -> None:
    same = [r for r in runs("*.json.gz") if r["candidate"].startswith("A/A")]
    assert len(same) >= 60  # pgbench and db_bench, quiet and with a hog
    settings = LiveSettings()
    for ratio in (settings.guard_ratio, 1.5):
        ended = [
            r["candidate"] for r in same if ends(r["evidence"], baseline_tail_us, ratio, settings)
        ]
        assert ended == [], ratio


def test_bfq_on_pgbench_is_ended_where_the_largest_tail_let_it_run() -> None:
    run = next(r for r in runs("20261126T2332Z-pgbench-quiet.json.gz") if "bfq" in r["candidate"])
    settings = LiveSettings()
    assert ends(run["evidence"], baseline_tail_us, settings.guard_ratio, settings)
    assert not ends(run["evidence"], largest, settings.guard_ratio, settings)
