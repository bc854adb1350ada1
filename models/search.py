"""Policy search: per device and workload, the best configuration for an objective, with how
sure the model is, and the configuration most worth a canary next.

One BootstrapRegressor per objective predicts the objective's metric (on a log scale: the
effects of a configuration are ratios) from a (device, workload, configuration) row. The
search scores every candidate configuration the device can run:

- exploitation: the predicted value, blended with the papers' priors, whose weight (in
  pseudo-observations) gives way as the cell's own observations accumulate;
- exploration: an upper confidence bound — predicted improvement plus `beta` standard
  deviations — picks the next canary, until the expected gain of the best untried
  configuration falls below `min_gain`.
Guardrails drop candidates whose pessimistic prediction of a guarded metric is worse than
the current configuration's by more than allowed (e.g. p99 may not grow over 10 %).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from sklearn.feature_extraction import DictVectorizer

from agent.contract.tunables import CompletionMode, DeviceConfig, Scheduler
from agent.contract.workloads import WorkloadSpec
from models.dataset import OBJECTIVE_METRIC, Sample, facts_for
from models.estimator import BootstrapRegressor
from models.features import DeviceFacts, config_key, config_label, row, workload_features
from models.priors import Objective, Prior, priors_for

PRIOR_EFFECT = math.log(1.05)
CELL_PSEUDO_COUNT = 1.0  # the model's prediction counts as one measurement of the cell
COVERAGE = 0.8  # what every interval blkpilot shows claims to hold
# calibrated half-widths a change must be expected to gain (see recommend); at 1 a change's
# 80 % interval must clear zero, else the class's rule or what the device runs. Measured on the
# grid, devices held out, 3 seeds (bench/results/policy_eval.md, 2026-11-26): at 1 the pick
# before any canary did worse on the mean than at 0 — p50 152 % against 114 %, p99 118 % against
# 107 %, IOPS 20.3 % against 13.9 % (no better than the kernel's default) — so it stays off
CAUTION = 0.0
# a device whose measured facts lie this far outside the training devices' (as a ratio) is one
# the model has not seen the like of: it extrapolates there, and the class's rule stands in.
# Off (inf) by default, measured: on the grid, devices held out, 3 seeds, at 1.5 the pick's
# mean regret before any canary was 114 % for p50 against 58 % without it (p99 107 against
# 103 %, IOPS 13.9 against 14.0 %): the class's rule is worse there than the model's guess
RANGE_MARGIN = math.inf
RANGE_FACTS = ("qd1_read_us", "write_over_read", "parallel_speedup")
Z80 = 1.2816  # the normal quantile an uncalibrated interval falls back on


@dataclass(frozen=True)
class Calibration:
    """How wide an 80 % interval must be to hold the truth in 80 % of cells the model has not
    seen — split-conformal, on the ensemble's out-of-bag predictions of whole cells (each
    member leaves about a third of the cells out; what those members predict for a cell is a
    held-out prediction of it, at no extra fit).

    A half-width is `scale` x (the members' spread + `floor`): the spread says where the model
    is less sure than elsewhere, the floor (the spreads' median) keeps a cell the members happen
    to agree on from an interval of nothing, and the scale is the conformal quantile of the
    held-out errors in those units. Values are a configuration's mean metric in a cell; changes
    are between two configurations of one cell (paired members: what they all get wrong about
    the cell as a whole cancels). `coverage` is measured on cells the scale was not fitted on
    (two halves, each checked with the other's scale), beside what the members' own spread
    (±1.28 standard deviations) covered."""

    value_scale: float = Z80
    value_floor: float = 0.0
    change_scale: float = Z80
    change_floor: float = 0.0
    coverage: dict[str, float] = field(default_factory=dict)
    units: int = 0  # (cell, configuration) pairs it was computed from; 0: not calibrated

    def value_half_width(self, std: float) -> float:
        return self.value_scale * (std + self.value_floor)

    def change_half_width(self, std: float) -> float:
        return self.change_scale * (std + self.change_floor)


def _conformal(scores: np.ndarray, coverage: float = COVERAGE) -> float:
    """The finite-sample conformal quantile: the ceil((n + 1) coverage)-th smallest score."""
    ordered = np.sort(scores)
    k = min(len(ordered), math.ceil((len(ordered) + 1) * coverage))
    return float(ordered[k - 1])


def calibrate(
    oob: np.ndarray,  # members x rows, NaN where the member saw the row's cell
    targets: np.ndarray,  # log metric per row
    cells: Sequence[tuple[str, str]],
    configs: Sequence[str],
    *,
    seed: int = 0,
) -> Calibration:
    """A Calibration from out-of-bag predictions (see the class)."""
    units: dict[tuple[tuple[str, str], str], list[int]] = defaultdict(list)
    for i, (cell, key) in enumerate(zip(cells, configs, strict=True)):
        units[(cell, key)].append(i)
    values: list[tuple[tuple[str, str], float, float, float]] = []  # cell, truth, mean, std
    by_cell: dict[tuple[str, str], list[tuple[int, np.ndarray, float]]] = defaultdict(list)
    for (cell, _), rows in units.items():
        members = oob[:, rows[0]]
        held = members[~np.isnan(members)]
        if len(held) < 2:
            continue
        truth = float(np.mean(targets[rows]))
        values.append((cell, truth, float(held.mean()), float(held.std())))
        by_cell[cell].append((len(rows), members, truth))
    changes: list[tuple[tuple[str, str], float, float, float]] = []
    for cell, found in by_cell.items():
        # against the configuration measured most often in the cell (the one a device runs)
        reference = max(range(len(found)), key=lambda j: found[j][0])
        _, base, base_truth = found[reference]
        for j, (_, members, truth) in enumerate(found):
            if j == reference:
                continue
            diff = (members - base)[~np.isnan(base)]
            changes.append((cell, truth - base_truth, float(diff.mean()), float(diff.std())))
    if len(values) < 10 or len(changes) < 10:
        return Calibration()
    scales, coverage = {}, {}
    for kind, found_units in (("value", values), ("change", changes)):
        error = np.array([abs(t - m) for _, t, m, _ in found_units])
        spread = np.array([sd for _, _, _, sd in found_units])
        floor = float(np.median(spread))
        score = error / np.maximum(spread + floor, 1e-12)
        scales[kind] = (_conformal(score), floor)
        coverage[f"{kind}_uncalibrated"] = round(float(np.mean(error <= Z80 * spread)), 3)
        # honest coverage: a scale fitted on half of the cells, checked on the other half
        names = sorted({cell for cell, *_ in found_units})
        random.Random(seed).shuffle(names)  # noqa: S311 (a split, not a secret)
        half = set(names[: len(names) // 2])
        first = np.array([cell in half for cell, *_ in found_units])
        inside = 0
        for fitted, checked in ((first, ~first), (~first, first)):
            if fitted.sum() and checked.sum():
                q = _conformal(score[fitted])
                inside += int(np.sum(score[checked] <= q))
        coverage[kind] = round(inside / len(found_units), 3)
    return Calibration(
        scales["value"][0],
        scales["value"][1],
        scales["change"][0],
        scales["change"][1],
        coverage,
        len(values),
    )


def candidates(device: DeviceFacts, available: Iterable[Scheduler]) -> list[DeviceConfig]:
    """The grid the search chooses from: each available scheduler with the parameters that
    decide its behaviour — mq-deadline's read deadline, batch and write starvation; kyber's
    read and write latency targets; bfq's idling and low_latency heuristics; fios'
    anticipation bound and read preference — and the poll modes where the device polls.
    Each stock scheduler's kernel defaults are among them (mq-deadline 500 ms / 16 / 2,
    kyber 2 ms / 10 ms, bfq 8 ms idling with low_latency), so fixed rules can be compared.
    25 configurations where the four stock schedulers are offered, 31 with fios, 33 polled."""
    available = set(available)
    grid: list[DeviceConfig] = []
    if Scheduler.NONE in available:
        grid.append(DeviceConfig(scheduler=Scheduler.NONE))
        if device.poll_queues > 0:
            polled = (CompletionMode.CLASSIC_POLL,) + (
                (CompletionMode.HYBRID_POLL,) if device.hybrid_poll else ()
            )  # hybrid polling left the kernel in 6.4: the agent refuses it there
            grid += [DeviceConfig(scheduler=Scheduler.NONE, completion=m) for m in polled]
    if Scheduler.MQ_DEADLINE in available:
        grid += [
            DeviceConfig(
                scheduler=Scheduler.MQ_DEADLINE,
                scheduler_tunables={"read_expire": r, "fifo_batch": b, "writes_starved": w},
            )
            for r in (20, 100, 500)
            for b in (1, 16)
            for w in (2, 8)
        ]
    if Scheduler.KYBER in available:
        grid += [
            DeviceConfig(
                scheduler=Scheduler.KYBER,
                scheduler_tunables={"read_lat_nsec": r, "write_lat_nsec": w},
            )
            for r in (250_000, 2_000_000)
            for w in (2_000_000, 10_000_000)
        ]
    if Scheduler.BFQ in available:
        grid += [
            DeviceConfig(
                scheduler=Scheduler.BFQ, scheduler_tunables={"slice_idle_us": s, "low_latency": low}
            )
            for s in (0, 2_000, 8_000, 16_000)
            for low in (0, 1)
        ]
    if Scheduler.FIOS in available:
        grid += [
            DeviceConfig(
                scheduler=Scheduler.FIOS,
                scheduler_tunables={"alpha_permille": a, "read_preference": rp},
            )
            for a in (0, 500, 900)
            for rp in (0, 1)
        ]
    return grid


@dataclass
class ObjectiveModel:
    objective: Objective
    vectorizer: DictVectorizer
    regressor: BootstrapRegressor
    higher_is_better: bool
    rows: int
    cells: Counter[tuple[str, str, str]] = field(
        default_factory=Counter
    )  # device, workload, config
    cell_logs: dict[tuple[str, str, str], float] = field(default_factory=dict)  # sums of logs
    calibration: Calibration = field(default_factory=Calibration)
    # each measured device fact's range over the training devices (RANGE_FACTS)
    fact_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)

    def outside(self, device: DeviceFacts, margin: float = RANGE_MARGIN) -> list[str]:
        """The device's measured facts beyond the training devices' range (by `margin`, a
        ratio; inf: none), each said with its value and the range."""
        found = []
        for name, (low, high) in self.fact_ranges.items():
            value = getattr(device, name)
            if value is None or low <= 0:
                continue
            if value < low / margin or value > high * margin:
                found.append(
                    f"{name} {value:.3g} outside the training devices' {low:.3g}-{high:.3g}"
                )
        return found

    def observed(self, key: tuple[str, str, str]) -> tuple[int, float]:
        """How often the cell was measured, and the mean of its log values (0 if never)."""
        n = self.cells[key]
        return n, (self.cell_logs.get(key, 0.0) / n if n else 0.0)

    def predict(self, features: Sequence[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation on the log scale."""
        members = self.members(features)
        return members.mean(axis=0), members.std(axis=0)

    def members(self, features: Sequence[dict[str, float]]) -> np.ndarray:
        """Every ensemble member's prediction (one row per member), on the log scale."""
        X = self.vectorizer.transform(list(features))  # noqa: N806
        return np.asarray(self.regressor.predict_members(X.toarray()))


@dataclass(frozen=True)
class MixModel:
    """A weighted mix of objectives (say p99 0.7, energy 0.3) as one model: its value is the
    weighted sum of each objective's log metric, signed so that higher is better — a 10 %
    gain in an objective of weight w counts as w x 10 %. The uncertainty combines the parts'
    (as if independent); each ensemble member is the same mix of the parts' members; the
    papers' priors of every part apply, scaled by its weight."""

    parts: tuple[tuple[ObjectiveModel, float], ...]
    higher_is_better: bool = True

    @classmethod
    def of(
        cls, models: dict[Objective, ObjectiveModel], weights: dict[Objective, float]
    ) -> MixModel:
        if not weights or any(w <= 0 or not math.isfinite(w) for w in weights.values()):
            raise ValueError("a mix needs positive, finite weights")
        missing = sorted(o.value for o in weights if o not in models)
        if missing:
            raise ValueError(f"no model for {', '.join(missing)} to mix")
        total = sum(weights.values())
        return cls(tuple((models[o], w / total) for o, w in sorted(weights.items())))

    @property
    def objective(self) -> str:
        return "mix(" + ",".join(f"{m.objective.value}={w:.2g}" for m, w in self.parts) + ")"

    @property
    def calibration(self) -> Calibration:
        """The parts' calibrations, weighted (a mix's interval is as wide as its parts')."""
        cals = [(model.calibration, weight) for model, weight in self.parts]
        return Calibration(
            sum(c.value_scale * w for c, w in cals),
            sum(c.value_floor * w for c, w in cals),
            sum(c.change_scale * w for c, w in cals),
            sum(c.change_floor * w for c, w in cals),
            units=min(c.units for c, _ in cals),
        )

    @property
    def cells(self) -> Counter[tuple[str, str, str]]:
        merged: Counter[tuple[str, str, str]] = Counter()
        for model, _ in self.parts:
            merged |= model.cells
        return merged

    def observed(self, key: tuple[str, str, str]) -> tuple[int, float]:
        seen = [model.observed(key) for model, _ in self.parts]
        n = min(count for count, _ in seen)
        if n == 0:
            return 0, 0.0
        return n, sum(
            weight * (1 if model.higher_is_better else -1) * log
            for (model, weight), (_, log) in zip(self.parts, seen, strict=True)
        )

    def predict(self, features: Sequence[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
        mean = np.zeros(len(features))
        var = np.zeros(len(features))
        for model, weight in self.parts:
            m, s = model.predict(features)
            mean += weight * (1 if model.higher_is_better else -1) * m
            var += (weight * s) ** 2
        return mean, np.sqrt(var)

    def members(self, features: Sequence[dict[str, float]]) -> np.ndarray:
        return np.asarray(
            sum(
                weight * (1 if model.higher_is_better else -1) * model.members(features)
                for model, weight in self.parts
            )
        )


@dataclass(frozen=True)
class Comparison:
    """One objective's predicted value under two configurations, and the change between them
    with an 80 % interval (from the ensemble members' own ratios)."""

    objective: Objective
    current: float
    recommended: float
    change: float  # recommended / current - 1
    change_low: float
    change_high: float
    higher_is_better: bool


def compare(
    model: ObjectiveModel,
    device_id: str,
    device: DeviceFacts,
    workload: WorkloadSpec,
    available: Iterable[Scheduler],
    current: DeviceConfig,
    recommended: DeviceConfig,
) -> Comparison:
    """The objective under both configurations as `recommend` estimates them (the cell's own
    measurements blended in), so that a recommendation's text and its table agree; the change's
    interval is the calibrated one."""
    grid = candidates(device, available)
    for config in (current, recommended):
        if config_key(config) not in {config_key(c) for c in grid}:
            grid.append(config)
    found = _estimate(model, device_id, device, workload, grid)
    keys = [config_key(c) for c in grid]
    i, j = keys.index(config_key(current)), keys.index(config_key(recommended))
    diff = found.members[:, j] - found.members[:, i]
    change = float(diff.mean())
    half = model.calibration.change_half_width(float(diff.std())) * max(
        found.shrink[i], found.shrink[j]
    )
    return Comparison(
        model.objective,
        math.exp(found.mean[i]),
        math.exp(found.mean[j]),
        math.expm1(change),
        math.expm1(change - half),
        math.expm1(change + half),
        model.higher_is_better,
    )


@dataclass
class _Estimates:
    """A cell's candidates as the model and the cell's own measurements estimate them (log
    scale): the mean, each member, the spread (shrunk where measured), how much a measured
    configuration's interval shrinks, and which were measured."""

    mean: np.ndarray
    members: np.ndarray
    std: np.ndarray
    raw_std: np.ndarray
    shrink: np.ndarray
    measured: set[int]
    spread: float


def _estimate(
    model: ObjectiveModel | MixModel,
    device_id: str,
    device: DeviceFacts,
    workload: WorkloadSpec,
    grid: Sequence[DeviceConfig],
) -> _Estimates:
    keys = [config_key(config) for config in grid]
    rows = [row(device, workload, config) for config in grid]
    mean, std = model.predict(rows)
    members = model.members(rows)
    raw_std = std.copy()
    # how far apart the model places the candidates, before the cell's own measurements pull
    # some of them in (0 when it cannot tell them apart: then a tenth, for what it cannot see)
    spread = float(np.std(mean)) or 0.1
    # each cell's own measurements outweigh the model's prediction as they accumulate: n of
    # them against CELL_PSEUDO_COUNT for the model (a model learns a cell from the others'
    # data, and a handful of trees seldom bend to a few rows among hundreds)
    moved: list[tuple[int, float]] = []  # (observations, how far they moved the cell)
    measured: set[int] = set()
    shrink = np.ones(len(grid))
    for i, key in enumerate(keys):
        n, observed = model.observed((device_id, workload.name, key))
        if n:
            blend = n / (n + CELL_PSEUDO_COUNT)
            moved.append((n, blend * (observed - mean[i])))
            measured.add(i)
            mean[i] += blend * (observed - mean[i])
            members[:, i] += blend * (observed - members[:, i])
            shrink[i] = math.sqrt(1 - blend)
            std[i] *= shrink[i]
    # what moved the measured configurations is, on average, what the model gets wrong about
    # this device running this workload at all: the untried ones move with them, or one
    # would look better than what was measured only because the model underestimates the
    # device and workload as a whole (and worse only because it overestimates them)
    if moved:
        offset = sum(n * shift for n, shift in moved) / sum(n for n, _ in moved)
        for i in range(len(grid)):
            if i not in measured:
                mean[i] += offset
                members[:, i] += offset
    return _Estimates(mean, members, std, raw_std, shrink, measured, spread)


def fit(samples: list[Sample], objective: Objective, *, random_state: int = 0) -> ObjectiveModel:
    metric, higher = OBJECTIVE_METRIC[objective]
    facts = facts_for(samples)
    rows, targets, cells = [], [], Counter[tuple[str, str, str]]()
    logs: dict[tuple[str, str, str], float] = {}
    keys: list[tuple[str, str, str]] = []
    for sample in samples:
        value = sample.value(objective)
        if value is None or value <= 0 or not math.isfinite(value):
            continue
        rows.append(row(facts[sample.device_id], sample.workload, sample.config))
        targets.append(math.log(value))
        key = (str(sample.device_id), sample.workload.name, config_key(sample.config))
        keys.append(key)
        cells[key] += 1
        logs[key] = logs.get(key, 0.0) + math.log(value)
    if len(rows) < 4:
        raise ValueError(f"{len(rows)} observations carry {metric}: too few to learn from")
    vectorizer = DictVectorizer(sparse=True)
    X = vectorizer.fit_transform(rows).toarray()  # noqa: N806
    y = np.array(targets)
    # members resample whole cells (device, workload): a cell's repeats in or out together
    groups = np.array([f"{d}\x1f{w}" for d, w, _ in keys])
    regressor = BootstrapRegressor(random_state=random_state).fit(X, y, groups=groups)
    oob = regressor.oob_members(X, groups)
    calibration = calibrate(
        oob,
        y,
        [(d, w) for d, w, _ in keys],
        [k for _, _, k in keys],
        seed=random_state,
    )
    ranges: dict[str, tuple[float, float]] = {}
    for name in RANGE_FACTS:
        values = [v for f in facts.values() if (v := getattr(f, name)) is not None]
        if values:
            ranges[name] = (min(values), max(values))
    return ObjectiveModel(
        objective, vectorizer, regressor, higher, len(rows), cells, logs, calibration, ranges
    )


@dataclass(frozen=True)
class ScoredConfig:
    config: DeviceConfig
    predicted: float  # in the metric's own unit
    low: float
    high: float
    std: float  # log scale
    observations: int
    priors: tuple[Prior, ...]


@dataclass(frozen=True)
class SearchResult:
    objective: Objective | str  # a MixModel's is its label
    best: ScoredConfig
    current: ScoredConfig | None
    next_canary: ScoredConfig | None
    expected_gain: float  # of next_canary over best, as a fraction (UCB)
    ranked: list[ScoredConfig]
    confidence: float = 0.0  # share of the ensemble's members that also rank `best` first
    # where `best` comes from: "model" (its pick), or, where the evidence for the model's pick
    # is weak (`doubts`), "current" (keep what the device runs) or "class rule" (the
    # configuration best on the mean over the device's class: `fallback` to recommend)
    basis: str = "model"
    doubts: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        best = self.best
        if self.basis != "model":
            figures = f"({best.predicted:.4g}, 80 % interval {best.low:.4g}-{best.high:.4g})"
            kept = (
                f"keeps the current {config_label(best.config)} {figures}"
                if self.basis == "current"
                else f"recommends {config_label(best.config)} {figures}, the class's rule (best"
                " on the mean over devices of its class)"
            )
            return f"{kept}: the model's evidence is weak ({'; '.join(self.doubts)})"
        parts = [
            f"{config_label(best.config)} is predicted best for {self.objective}"
            f" ({best.predicted:.4g}, 80 % interval {best.low:.4g}-{best.high:.4g})"
        ]
        if self.current is not None and self.current.config != best.config:
            change = best.predicted / self.current.predicted - 1 if self.current.predicted else 0
            parts.append(f"{change:+.1%} against the current {config_label(self.current.config)}")
        parts.append(f"from {best.observations} observations of this cell")
        for prior in best.priors:
            parts.append(
                f"{'against' if prior.avoid else 'with'} the prior '{prior.reason}'"
                f" ({prior.citation})"
            )
        return "; ".join(parts)


def _priors(
    model: ObjectiveModel | MixModel,
    device: DeviceFacts,
    workload: WorkloadSpec,
    among: Sequence[Prior] | None = None,
) -> list[tuple[Prior, float]]:
    features = workload_features(workload)
    if isinstance(model, ObjectiveModel):
        return [(p, 1.0) for p in priors_for(device, features, model.objective, among)]
    weights: dict[str, float] = {}
    found: dict[str, Prior] = {}
    for part, weight in model.parts:
        for prior in priors_for(device, features, part.objective, among):
            found[prior.name] = prior
            weights[prior.name] = weights.get(prior.name, 0.0) + weight
    return [(found[name], weights[name]) for name in sorted(found)]


def recommend(
    model: ObjectiveModel | MixModel,
    device_id: str,
    device: DeviceFacts,
    workload: WorkloadSpec,
    available: Iterable[Scheduler],
    *,
    current: DeviceConfig | None = None,
    beta: float = 1.0,
    min_gain: float = 0.02,
    caution: float = CAUTION,
    guard: tuple[ObjectiveModel, float] | None = None,
    among: Sequence[DeviceConfig] | None = None,
    priors: Sequence[Prior] | None = None,
    fallback: DeviceConfig | None = None,
    skill: float | None = None,
    range_margin: float = RANGE_MARGIN,
) -> SearchResult:
    """Score every candidate for this device and workload (or only those `among`), with the
    papers' priors (or only those in `priors`: the evaluation's ablation); see the module
    docstring.

    Safe before the first canary: where the model's evidence for a change is weak — no
    change's calibrated interval clears zero (`caution`), its cross-validated `skill` is not
    positive, or the device's measured facts lie outside the training devices' — the
    recommendation is `fallback` (the class's rule: its strongest fixed configuration) where
    the model does not expect that to be worse than `current`, else `current`; `basis` says
    which and `doubts` why."""
    grid = list(among) if among is not None else candidates(device, available)
    if current is not None and config_key(current) not in {config_key(c) for c in grid}:
        grid.append(current)
    keys = [config_key(config) for config in grid]
    found = _estimate(model, device_id, device, workload, grid)
    scored, utility = _scored(model, device_id, device, workload, grid, keys, found, priors)
    here = keys.index(config_key(current)) if current is not None else None
    allowed = set(range(len(grid)))
    if guard is not None and here is not None:
        allowed = _within_guard(guard, [row(device, workload, c) for c in grid], here)
    order = _ranked(model, found, utility, allowed, here, caution)
    doubts = _doubts(model, device, grid, utility, allowed, order, here, skill, range_margin)
    basis = "model"
    if doubts and here is not None:
        pick, basis = here, "current"
        if fallback is not None and config_key(fallback) in keys:
            rule = keys.index(config_key(fallback))
            if rule != here and rule in allowed and utility[rule] >= utility[here]:
                pick, basis = rule, "class rule"
        order = [pick, *(i for i in order if i != pick)]
    next_canary, gain = _next_canary(scored, utility, found, order, keys, current, beta, min_gain)
    return SearchResult(
        model.objective,
        scored[order[0]],
        scored[here] if here is not None else None,
        next_canary,
        gain,
        [scored[i] for i in order],
        _confidence(model, found, utility, allowed, order[0]),
        basis,
        tuple(doubts),
    )


def _scored(
    model: ObjectiveModel | MixModel,
    device_id: str,
    device: DeviceFacts,
    workload: WorkloadSpec,
    grid: list[DeviceConfig],
    keys: list[str],
    found: _Estimates,
    priors: Sequence[Prior] | None,
) -> tuple[list[ScoredConfig], list[float]]:
    """Each candidate's prediction with its calibrated interval, and its utility (higher is
    better, whatever the objective) with the applicable priors' shift."""
    mean = found.mean
    calibration = model.calibration
    sign = 1.0 if model.higher_is_better else -1.0
    applicable = _priors(model, device, workload, priors)
    # a prior moves its configuration by an effect of at least 5 % (or the spread between
    # the candidates, if larger), weighted s / (n + s): n observations of the cell outweigh it
    effect = max(found.spread, PRIOR_EFFECT)
    scored, utility = [], []
    for i, config in enumerate(grid):
        seen = model.cells[(device_id, workload.name, keys[i])]
        weighted = [(p, w) for p, w in applicable if _matches(p.config, config)]
        matched = tuple(p for p, _ in weighted)
        shift = sum(
            (-1 if p.avoid else 1)
            * w
            * p.strength
            / (seen + p.strength)
            * max(effect, p.effect or 0.0)
            for p, w in weighted
        )
        value = mean[i] + sign * shift
        half = calibration.value_half_width(float(found.raw_std[i])) * found.shrink[i]
        low, high = math.exp(mean[i] - half), math.exp(mean[i] + half)
        scored.append(
            ScoredConfig(config, math.exp(mean[i]), low, high, float(found.std[i]), seen, matched)
        )
        utility.append(sign * value)
    return scored, utility


def _within_guard(
    guard: tuple[ObjectiveModel, float], rows: list[dict[str, float]], here: int
) -> set[int]:
    """The candidates the guard objective's model does not expect to lose more than its
    limit against the current configuration (index `here`), pessimistically."""
    guard_model, limit = guard
    allowed = set(range(len(rows)))
    # each member's change from the current configuration, paired: what the members are
    # all unsure of alike (how this device does this workload at all) cancels, and only
    # their doubt about the difference makes a candidate look risky
    g_members = guard_model.members(rows)
    change = g_members - g_members[:, [here]]
    g_sign = 1.0 if guard_model.higher_is_better else -1.0
    for i in range(len(rows)):
        if i == here:
            continue  # the yardstick: staying put is always allowed
        pessimistic = change[:, i].mean() - g_sign * change[:, i].std()
        if g_sign * pessimistic < math.log(1 - limit):
            allowed.discard(i)
    return allowed


def _ranked(
    model: ObjectiveModel | MixModel,
    found: _Estimates,
    utility: list[float],
    allowed: set[int],
    here: int | None,
    caution: float,
) -> list[int]:
    """The allowed candidates, best first. The recommendation leaves what the device runs
    only for what the model expects to be better by more than `caution` calibrated
    half-widths of the change's interval: a pick among many candidates whose predicted
    differences are mostly noise is otherwise the one the model overrates most (the canary's
    UCB still explores the promising ones)."""
    ranking = list(utility)
    if here is not None and caution > 0:
        members = found.members
        for i in allowed - {here}:
            diff = members[:, i] - members[:, here]
            shrink = max(found.shrink[i], found.shrink[here])
            ranking[i] -= caution * model.calibration.change_half_width(float(diff.std())) * shrink
    return sorted(allowed, key=lambda i: -ranking[i])


def _doubts(
    model: ObjectiveModel | MixModel,
    device: DeviceFacts,
    grid: list[DeviceConfig],
    utility: list[float],
    allowed: set[int],
    order: list[int],
    here: int | None,
    skill: float | None,
    range_margin: float,
) -> list[str]:
    """Why the model's pick is not to be trusted before a canary, if it is not."""
    doubts = []
    if here is not None and config_key(grid[order[0]]) == config_key(grid[here]):
        favourite = max(allowed, key=lambda i: utility[i])
        if config_key(grid[favourite]) != config_key(grid[here]):
            doubts.append(
                f"{config_label(grid[favourite])} is predicted better, but its 80 % interval"
                " crosses zero"
            )
    if skill is not None and skill <= 0:
        doubts.append(
            f"cross-validated R² {skill:.2f}: no skill on devices (or cells) it had not seen"
        )
    return doubts + model_outside(model, device, range_margin)


def _confidence(
    model: ObjectiveModel | MixModel,
    found: _Estimates,
    utility: list[float],
    allowed: set[int],
    pick: int,
) -> float:
    """The share of the ensemble's members that, with the same priors, vote for the pick."""
    sign = 1.0 if model.higher_is_better else -1.0
    shifts = np.array([sign * u - m for u, m in zip(utility, found.mean, strict=True)])
    votes = sign * (found.members + shifts)
    candidates_allowed = sorted(allowed)
    firsts = [candidates_allowed[int(np.argmax(v[candidates_allowed]))] for v in votes]
    return sum(1 for first in firsts if first == pick) / len(firsts)


def _next_canary(
    scored: list[ScoredConfig],
    utility: list[float],
    found: _Estimates,
    order: list[int],
    keys: list[str],
    current: DeviceConfig | None,
    beta: float,
    min_gain: float,
) -> tuple[ScoredConfig | None, float]:
    """The untried candidate a canary should measure next (upper confidence bound), and the
    gain it could bring; None below min_gain. The configuration the device runs is never a
    canary's candidate: every canary measures it anyway, as its baseline arm."""
    running = config_key(current) if current is not None else None
    untried = [i for i in order if scored[i].observations == 0 and keys[i] != running]
    if not untried:
        return None, 0.0
    # an untried cell is also uncertain for want of data: the model's spread between
    # configurations stands in for what a first canary could reveal
    ucb = {i: utility[i] + beta * math.hypot(found.std[i], found.spread) for i in untried}
    pick = max(ucb, key=lambda i: ucb[i])
    gain = math.expm1(ucb[pick] - utility[order[0]])
    return (scored[pick] if gain >= min_gain else None), gain


def strongest_rule(
    cells: Iterable[Mapping[str, float]],
    higher_is_better: bool,
    among: Iterable[str] | None = None,
    *,
    min_share: float = 0.5,
) -> str | None:
    """The strongest fixed rule: of the configurations (keys; only those `among`, if given)
    measured in at least `min_share` of the cells, the one with the lowest mean regret against
    each cell's best — each cell given as its configurations' mean metric; a cell that
    measured one configuration compares nothing and is left out."""
    wanted = set(among) if among is not None else None
    scores: dict[str, list[float]] = {}
    found = [cell for cell in cells if len(cell) >= 2]
    for cell in found:
        best = (max if higher_is_better else min)(cell.values())
        if best <= 0:
            continue
        for key, value in cell.items():
            if wanted is None or key in wanted:
                lost = 1 - value / best if higher_is_better else value / best - 1
                scores.setdefault(key, []).append(max(0.0, lost))
    enough = {k: v for k, v in scores.items() if len(v) >= min_share * len(found)}
    if not enough:
        return None
    return min(enough, key=lambda k: (statistics.fmean(enough[k]), k))


def class_rule(samples: Sequence[Sample], objective: Objective) -> DeviceConfig | None:
    """The class's rule for the nightly job: strongest_rule over the cells (device, workload)
    of `samples` (a class's), each configuration's mean of the objective's metric."""
    _, higher = OBJECTIVE_METRIC[objective]
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    configs: dict[str, DeviceConfig] = {}
    for sample in samples:
        value = sample.value(objective)
        if value is None or value <= 0 or not math.isfinite(value):
            continue
        key = config_key(sample.config)
        configs[key] = sample.config
        cell = values.setdefault((str(sample.device_id), sample.workload.name), {})
        cell.setdefault(key, []).append(value)
    cells = [{k: statistics.fmean(v) for k, v in cell.items()} for cell in values.values()]
    found = strongest_rule(cells, higher)
    return configs[found] if found is not None else None


def model_outside(
    model: ObjectiveModel | MixModel, device: DeviceFacts, margin: float = RANGE_MARGIN
) -> list[str]:
    """The device's facts outside the training devices' range, for a model or a mix's parts."""
    if isinstance(model, ObjectiveModel):
        return model.outside(device, margin)
    return sorted({d for part, _ in model.parts for d in part.outside(device, margin)})


def _matches(prior: DeviceConfig, config: DeviceConfig) -> bool:
    """A prior names a scheduler, maybe a completion mode and some tunables; a candidate
    matches when it agrees on everything the prior names."""
    if prior.scheduler is not None and prior.scheduler != (config.scheduler or Scheduler.NONE):
        return False
    if prior.completion is not None and prior.completion != (
        config.completion or CompletionMode.INTERRUPT
    ):
        return False
    return all(config.scheduler_tunables.get(k) == v for k, v in prior.scheduler_tunables.items())
