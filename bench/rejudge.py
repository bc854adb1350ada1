"""The live canary's judge tried again on canaries already run: each run's evidence (kept by
`bench.live_apps` in bench/results/live_apps_evidence/, written by `agent canary --evidence`)
judged look by look — at each look the canary planned, on the pairs it had by then — by the
judge as it is now and by the single-interval rule it replaced (one interval at
1 - alpha / metrics deciding both a pass and a fail). Same pairs, same looks: what differs is
the rule alone. A run the guard ended has no looks to judge again (its verdict is the guard's).

    python -m bench.rejudge bench/results/live_apps_evidence/*.json.gz

Where the evidence keeps each pair's latency histograms (from 2026-11-26 20:00 UTC), it also
prints, as a diagnostic beside the verdicts, the tail judged another way: the p99 of every
I/O each arm served (the pairs' histograms pooled) as a ratio B/A, with a 90 % bootstrap
interval over pairs (pairs resampled whole, so what one pair's two intervals share stays
together) — the estimator the per-pair p99 log-ratios are compared with when the tail is too
noisy to judge interval by interval (pgbench beside a CPU hog).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from agent.contract import histograms
from agent.contract.verdict import levels
from agent.live_judge import judge_evidence
from bench.record import evidence_bundles


def single_interval(alpha: float, metrics: int) -> tuple[float, float]:
    """The rule before 2026-11-26: one interval at 1 - alpha / metrics for both decisions."""
    return 1 - alpha / metrics, 1 - alpha / metrics


RULES = {"now": levels, "single interval": single_interval}


def sequential(evidence: dict[str, Any], rule: str) -> tuple[str, int | None]:
    """The verdict the rule reaches over the canary's planned looks, and after how many pairs
    (None: the guard decided; no look was judged). "undecided": inconclusive at every look
    the evidence reaches, where the canary (deciding earlier) stopped before the last."""
    if evidence.get("guard_tripped"):
        return evidence["verdict"], None
    had = len(evidence["rates"]["A"])
    verdict, at = "inconclusive", had
    for target in evidence["looks_planned"]:
        if target > had:
            return "undecided", at  # the live canary stopped before this look
        verdict, at = judge_evidence(evidence, target, RULES[rule])[0].value, target
        if verdict != "inconclusive":
            break
    return verdict, at


def pooled_tail(
    evidence: dict[str, Any], q: float = 0.99, rounds: int = 400, seed: int = 1
) -> tuple[float, float, float] | None:
    """The q-quantile of all the I/Os of B over that of A (each arm's pairs' histograms
    pooled), and its 90 % percentile-bootstrap interval over pairs; None without histograms."""
    kept = evidence.get("latency")
    if not kept or not kept["A"]:
        return None
    arms = {arm: [dict(map(tuple, h)) for h in kept[arm]] for arm in "AB"}

    def ratio(pairs: list[int]) -> float:
        a = histograms.quantile(histograms.merge(arms["A"][i] for i in pairs), q) or 1.0
        b = histograms.quantile(histograms.merge(arms["B"][i] for i in pairs), q) or 0.0
        return b / a

    n = len(arms["A"])
    rng = random.Random(seed)
    draws = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(rounds))
    return ratio(list(range(n))), draws[int(0.05 * rounds)], draws[int(0.95 * rounds) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "bundles", nargs="*", type=Path, help="default: every bundle bench.live_apps recorded"
    )
    parser.add_argument("--latest", type=int, help="only the newest N bundles")
    args = parser.parse_args()
    tally: Counter[tuple[str, str, str, str]] = Counter()
    for bundle in evidence_bundles(args.bundles, args.latest):
        with gzip.open(bundle, "rt") as handle:
            runs = json.load(handle)
        for run in runs:
            evidence = run.get("evidence")
            if evidence is None:
                continue
            found = {rule: sequential(evidence, rule) for rule in RULES}
            tail = None if evidence.get("guard_tripped") else pooled_tail(evidence)
            print(
                f"{bundle.name} {run['app']} {run['candidate']}: live {run['verdict']}"
                f" ({run['seconds']:.0f} s)"
                + "".join(f"; {r}: {v} at {n} pairs" for r, (v, n) in found.items())
                + (
                    f"; pooled p99 B/A {tail[0]:.3f} (90 % {tail[1]:.3f} … {tail[2]:.3f})"
                    if tail
                    else ""
                )
            )
            for rule, (verdict, _) in found.items():
                tally[run["app"], run["candidate"], rule, verdict] += 1
    for (app, candidate, rule, verdict), count in sorted(tally.items()):
        print(f"{app:9} {candidate:32} {rule:16} {verdict:13} {count}")


if __name__ == "__main__":
    main()
