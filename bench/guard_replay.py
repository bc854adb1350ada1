"""The live canary's guard tried again on canaries already run: the recorded pairs' latency
histograms (bench/results/live_apps_evidence/, from 2026-11-26 20:00 UTC) replayed interval by
interval through the guard's two steps — a strike when the candidate's pooled p99 passes the
limit, ended when its next interval after a baseline interval passes it again (the limit then
at least the ratio times the baseline's p99 since the strike) — with the baseline's tail taken
as the guard takes it now (`agent.live_judge.baseline_tail_us`: the largest interval p99 but
one) and as it did before 2026-11-28 (the largest). Counts, per application, host and
candidate, the runs each would have ended.

An approximation of the agent's guard, said plainly: the agent checks the candidate's pooled
p99 four times within an interval, here once at its end; the evidence holds the judged pairs
only (set-aside pairs are not in it) and a run the guard really ended holds its pairs up to
then. What it can show is the difference between the two tails on the same intervals.

    python -m bench.guard_replay bench/results/live_apps_evidence/*.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.contract import histograms
from agent.live_judge import LiveSettings, baseline_tail_us
from bench.record import evidence_bundles

Tail = Callable[[Sequence[float], int], float | None]


def largest(p99s: Sequence[float], min_intervals: int) -> float | None:
    """The tail before 2026-11-28: the largest interval p99."""
    return max(p99s) if len(p99s) >= min_intervals else None


TAILS: dict[str, Tail] = {"largest but one (now)": baseline_tail_us, "largest": largest}


def _p99_us(parts: Sequence[histograms.Sparse]) -> tuple[float, int]:
    merged = histograms.merge(parts)
    return (histograms.quantile(merged, 0.99) or 0.0) / 1000, sum(c for _, c in merged)


def ends(evidence: dict[str, Any], tail_of: Tail, ratio: float, settings: LiveSettings) -> bool:
    """Whether the guard, with this tail and ratio, would have ended the run."""
    baseline: list[float] = []
    served: list[histograms.Sparse] = []
    since: list[histograms.Sparse] | None = None  # baseline since a strike
    for a, b in zip(evidence["latency"]["A"], evidence["latency"]["B"], strict=True):
        p99, ios = _p99_us([a])
        if ios >= settings.min_ios:
            baseline.append(p99)
        if since is not None:
            since.append(a)
        tail = tail_of(baseline, settings.guard_min_intervals)
        if tail is None:
            served.append(b)
            continue
        limit = ratio * max(tail, 1.0)
        p99, ios = _p99_us([b])
        if since and ios >= settings.min_ios:
            if p99 > max(limit, ratio * _p99_us(since)[0]):
                return True
            since = None
        served.append(b)
        pooled, ios = _p99_us(served)
        if since is None and ios >= settings.min_ios and pooled > limit:
            since = []
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "bundles", nargs="*", type=Path, help="default: every bundle bench.live_apps recorded"
    )
    parser.add_argument("--latest", type=int, help="only the newest N bundles")
    parser.add_argument("--ratio", type=float, action="append")
    args = parser.parse_args()
    settings = LiveSettings()
    ratios = args.ratio or [settings.guard_ratio, 1.5]
    runs = []
    for bundle in evidence_bundles(args.bundles, args.latest):
        host = "hog" if "hog" in bundle.name else "quiet"
        for run in json.loads(gzip.decompress(bundle.read_bytes())):
            if "latency" in run["evidence"]:
                runs.append((f"{run['app']} {host}: {run['candidate']}", run["evidence"]))
    for ratio in ratios:
        print(f"guard at {ratio:g}x the baseline's tail: runs ended / runs")
        for name, tail_of in TAILS.items():
            total, ended = Counter[str](), Counter[str]()
            for label, evidence in runs:
                total[label] += 1
                ended[label] += ends(evidence, tail_of, ratio, settings)
            print(f"  tail = {name}")
            for label in sorted(total):
                print(f"    {label:60} {ended[label]}/{total[label]}")


if __name__ == "__main__":
    main()
