"""`blkpilot eval`: the policy search judged on a ground-truth grid (models.grid).

For every cell (device, workload) and objective, the cell is held out of training: the
models learn from every other cell — other workloads on the same device, the same workload on
other devices — and the search recommends for the held-out cell from the device's current
(kernel default) configuration. Then canaries: the search names the configuration most worth
one, the canary "runs" (one measured repetition of that configuration on that cell, taken
from the grid, a different repetition for each canary), its result joins the training data
with a repetition of the configuration the device runs — the canary's baseline arm, which the
agent records as well —, and the search recommends again, until it names no canary or
`max_canaries` were run.

The choice after k canaries is what blkpilot would keep: the best, by the search's estimate,
of what is proven on that device — the configuration it runs and those a canary measured (a
change is kept only after a canary); the model's own favourite is reported beside it.

Regret of a choice: how much worse the configuration's true value (its mean over the grid's
repetitions) is than the best configuration's, as a fraction (latency: chosen / best - 1;
IOPS: 1 - chosen / best). The same for the fixed rules: the kernel's default, always none,
and the udev rule none-for-non-rotational / bfq-for-rotational.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from models.dataset import OBJECTIVE_METRIC, Sample, facts_for
from models.features import config_key
from models.grid import Grid
from models.priors import Objective
from models.search import fit, recommend

WITHIN = 0.02  # "within 2 % of the oracle"


def regret(value: float, best: float, higher_is_better: bool) -> float:
    if higher_is_better:
        return max(0.0, 1 - value / best) if best > 0 else 0.0
    return max(0.0, value / best - 1) if best > 0 else 0.0


@dataclass
class CellResult:
    device: str
    workload: str
    objective: str
    oracle: str
    oracle_value: float
    chosen: list[str]  # after 0, 1, ... canaries: the best proven configuration
    regrets: list[float]
    canaries: list[str]
    baselines: dict[str, float]  # rule -> regret
    model_regrets: list[float] = field(default_factory=list)  # the model's favourite's
    noise_floor: float = 0.0  # regret of measuring every configuration once and taking the best
    repeat_cv: float = 0.0  # median over configurations of the repeats' spread / mean

    @property
    def final_regret(self) -> float:
        return self.regrets[-1]

    @property
    def canaries_to_within(self) -> int | None:
        """Canaries run before the choice first came within 2 % of the oracle."""
        return next((k for k, r in enumerate(self.regrets) if r <= WITHIN), None)


@dataclass
class Report:
    objective: str
    cells: list[CellResult] = field(default_factory=list)

    @property
    def median_regret(self) -> float:
        return statistics.median(c.final_regret for c in self.cells)

    @property
    def mean_regret(self) -> float:
        return statistics.fmean(c.final_regret for c in self.cells)

    def baseline_median(self, rule: str) -> float:
        return statistics.median(c.baselines[rule] for c in self.cells)

    def baseline_mean(self, rule: str) -> float:
        return statistics.fmean(c.baselines[rule] for c in self.cells)

    @property
    def rules(self) -> list[str]:
        return sorted(self.cells[0].baselines) if self.cells else []

    @property
    def max_canaries_used(self) -> int:
        return max((len(c.canaries) for c in self.cells), default=0)

    def summary(self) -> dict[str, Any]:
        within = [c.canaries_to_within for c in self.cells]
        return {
            "objective": self.objective,
            "cells": len(self.cells),
            "median_regret": round(self.median_regret, 4),
            "mean_regret": round(self.mean_regret, 4),
            "median_regret_before_canaries": round(
                statistics.median(c.regrets[0] for c in self.cells), 4
            ),
            "median_regret_model_favourite": round(
                statistics.median(c.model_regrets[-1] for c in self.cells), 4
            ),
            "cells_within_2pct": sum(1 for c in self.cells if c.final_regret <= WITHIN),
            "median_canaries": statistics.median(len(c.canaries) for c in self.cells),
            "max_canaries": self.max_canaries_used,
            "canaries_to_within_2pct": {
                "median": statistics.median(w for w in within if w is not None)
                if any(w is not None for w in within)
                else None,
                "never": sum(1 for w in within if w is None),
            },
            "baselines": {
                rule: {
                    "median_regret": round(self.baseline_median(rule), 4),
                    "mean_regret": round(self.baseline_mean(rule), 4),
                }
                for rule in self.rules
            },
            # what measurement noise alone costs: every configuration measured once (not 4
            # canaries: all of them) and the best taken, judged like the search's choice
            "noise_floor_median": round(statistics.median(c.noise_floor for c in self.cells), 4),
            "repeat_cv_median": round(statistics.median(c.repeat_cv for c in self.cells), 4),
            "beats_every_baseline": all(
                self.median_regret <= self.baseline_median(rule)
                and self.mean_regret < self.baseline_mean(rule)
                for rule in self.rules
            ),
        }


def objectives_for(grid: Grid, device: str, workload: str) -> list[Objective]:
    """Latency, IOPS; fairness only where several tasks share the device; energy where the
    grid measured it."""
    found = []
    for objective in Objective:
        if grid.truth(device, workload, objective):
            found.append(objective)
    return found


def evaluate_cell(
    grid: Grid,
    device: str,
    workload: str,
    objective: Objective,
    *,
    max_canaries: int = 4,
    random_state: int = 0,
) -> CellResult:
    _, higher = OBJECTIVE_METRIC[objective]
    truth = grid.truth(device, workload, objective)
    if not truth:
        raise ValueError(f"the grid has no {objective.value} for {device} / {workload}")
    pick = max if higher else min
    oracle = pick(truth, key=lambda k: truth[k])
    found = grid.devices[device]
    spec = grid.workloads[workload]
    training = grid.samples(exclude=[(device, workload)])
    measured = list(grid.configs(device, workload).values())  # the search chooses among these
    canaries: list[Sample] = []
    chosen: list[str] = []
    regrets: list[float] = []
    model_regrets: list[float] = []
    names: list[str] = []
    start = datetime.now(UTC)
    for k in range(max_canaries + 1):
        samples = training + canaries
        model = fit(samples, objective, random_state=random_state)
        facts = facts_for(samples).get(found.id)
        if facts is None:
            raise ValueError(f"no observations of {device} outside the held-out cell")
        rec = recommend(
            model,
            str(found.id),
            facts,
            spec,
            found.available,
            current=found.default,
            among=measured,
        )
        # what blkpilot keeps: the best of what is proven on the cell — the configuration the
        # device runs and those a canary measured (rec.ranked is best first); the model's own
        # favourite, proven or not, is kept for comparison
        proven = {config_key(found.default), *names}
        key = next(config_key(s.config) for s in rec.ranked if config_key(s.config) in proven)
        favourite = config_key(rec.best.config)
        for name in (key, favourite):
            if name not in truth:
                raise ValueError(f"the grid did not measure {name} on {device} / {workload}")
        chosen.append(key)
        regrets.append(regret(truth[key], truth[oracle], higher))
        model_regrets.append(regret(truth[favourite], truth[oracle], higher))
        if k == max_canaries or rec.next_canary is None:
            break
        canary_key = config_key(rec.next_canary.config)
        runs = grid.repeats(device, workload, canary_key)
        if not runs:
            raise ValueError(f"the grid did not measure {canary_key} on {device} / {workload}")
        tried = sum(1 for name in names if name == canary_key)
        run = runs[tried % len(runs)]
        at = start + timedelta(seconds=k + 1)
        canaries.append(grid.sample(run, at=at))
        names.append(canary_key)
        # a canary's baseline rounds measure the configuration the device runs as well
        # (the agent records them as a benchmark of it: agent.bench.report)
        baseline = grid.repeats(device, workload, config_key(found.default))
        if baseline:
            canaries.append(grid.sample(baseline[k % len(baseline)], at=at))
    baselines = {
        rule: regret(truth[config_key(config)], truth[oracle], higher)
        for rule, config in grid.baselines(device).items()
        if config_key(config) in truth
    }
    floor, cv = _noise(grid, device, workload, objective, truth, truth[oracle], higher)
    return CellResult(
        device,
        workload,
        objective.value,
        oracle,
        truth[oracle],
        chosen,
        regrets,
        names,
        baselines,
        model_regrets,
        floor,
        cv,
    )


def _noise(
    grid: Grid,
    device: str,
    workload: str,
    objective: Objective,
    truth: dict[str, float],
    best: float,
    higher: bool,
) -> tuple[float, float]:
    metric, _ = OBJECTIVE_METRIC[objective]
    by_repeat: dict[int, dict[str, float]] = {}
    spreads = []
    for key in truth:
        values = {
            r.repeat: r.metrics[metric]
            for r in grid.repeats(device, workload, key)
            if metric in r.metrics
        }
        for repeat, value in values.items():
            by_repeat.setdefault(repeat, {})[key] = value
        if len(values) > 1 and statistics.fmean(values.values()) > 0:
            spreads.append(statistics.pstdev(values.values()) / statistics.fmean(values.values()))
    pick = max if higher else min
    floors = [
        regret(truth[pick(once, key=lambda k: once[k])], best, higher)
        for once in by_repeat.values()
        if once
    ]
    return (
        statistics.median(floors) if floors else 0.0,
        statistics.median(spreads) if spreads else 0.0,
    )


Task = tuple[str, str, Objective]


def tasks(grid: Grid, objectives: Iterable[Objective] | None = None) -> list[Task]:
    wanted = set(objectives) if objectives is not None else None
    return [
        (device, workload, objective)
        for device, workload in grid.cells()
        for objective in objectives_for(grid, device, workload)
        if wanted is None or objective in wanted
    ]


def evaluate(
    grid: Grid,
    objectives: Sequence[Objective] | None = None,
    *,
    max_canaries: int = 4,
    mapper: Callable[[Callable[[Task], CellResult], list[Task]], list[CellResult]] | None = None,
) -> dict[str, Report]:
    """Every cell and objective; `mapper` runs the cells (default: one after another; the CLI
    passes Ray's)."""
    todo = tasks(grid, objectives)

    def one(task: Task) -> CellResult:
        device, workload, objective = task
        return evaluate_cell(grid, device, workload, objective, max_canaries=max_canaries)

    results = mapper(one, todo) if mapper is not None else [one(t) for t in todo]
    reports: dict[str, Report] = {}
    for result in results:
        reports.setdefault(result.objective, Report(result.objective)).cells.append(result)
    return reports


def as_json(reports: dict[str, Report]) -> dict[str, Any]:
    return {
        name: {**report.summary(), "cells": [asdict(c) for c in report.cells]}
        for name, report in reports.items()
    }
