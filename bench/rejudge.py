"""The live canary's judge tried again on canaries already run: each run's evidence (kept by
`bench.live_apps` in bench/results/live_apps_evidence/, written by `agent canary --evidence`)
judged look by look — at each look the canary planned, on the pairs it had by then — by the
judge as it is now and by the single-interval rule it replaced (one interval at
1 - alpha / metrics deciding both a pass and a fail). Same pairs, same looks: what differs is
the rule alone. A run the guard ended has no looks to judge again (its verdict is the guard's).

    python -m bench.rejudge bench/results/live_apps_evidence/*.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

from agent.contract.verdict import levels
from agent.live_judge import judge_evidence


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", nargs="+", type=Path)
    args = parser.parse_args()
    tally: Counter[tuple[str, str, str, str]] = Counter()
    for bundle in args.bundles:
        with gzip.open(bundle, "rt") as handle:
            runs = json.load(handle)
        for run in runs:
            evidence = run.get("evidence")
            if evidence is None:
                continue
            found = {rule: sequential(evidence, rule) for rule in RULES}
            print(
                f"{bundle.name} {run['app']} {run['candidate']}: live {run['verdict']}"
                f" ({run['seconds']:.0f} s)"
                + "".join(f"; {r}: {v} at {n} pairs" for r, (v, n) in found.items())
            )
            for rule, (verdict, _) in found.items():
                tally[run["app"], run["candidate"], rule, verdict] += 1
    for (app, candidate, rule, verdict), count in sorted(tally.items()):
        print(f"{app:9} {candidate:32} {rule:16} {verdict:13} {count}")


if __name__ == "__main__":
    main()
