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
from collections import Counter
from collections.abc import Iterable, Sequence
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
            polled = (CompletionMode.CLASSIC_POLL, CompletionMode.HYBRID_POLL)
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

    def observed(self, key: tuple[str, str, str]) -> tuple[int, float]:
        """How often the cell was measured, and the mean of its log values (0 if never)."""
        n = self.cells[key]
        return n, (self.cell_logs.get(key, 0.0) / n if n else 0.0)

    def predict(self, features: Sequence[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation on the log scale."""
        X = self.vectorizer.transform(list(features))  # noqa: N806
        mean, std = self.regressor.predict(X.toarray(), return_std=True)
        return np.asarray(mean), np.asarray(std)

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
    device: DeviceFacts,
    workload: WorkloadSpec,
    current: DeviceConfig,
    recommended: DeviceConfig,
) -> Comparison:
    members = model.members([row(device, workload, current), row(device, workload, recommended)])
    ratios = np.expm1(members[:, 1] - members[:, 0])
    mean = members.mean(axis=0)
    return Comparison(
        model.objective,
        math.exp(mean[0]),
        math.exp(mean[1]),
        math.expm1(mean[1] - mean[0]),
        float(np.quantile(ratios, 0.1)),
        float(np.quantile(ratios, 0.9)),
        model.higher_is_better,
    )


def fit(samples: list[Sample], objective: Objective, *, random_state: int = 0) -> ObjectiveModel:
    metric, higher = OBJECTIVE_METRIC[objective]
    facts = facts_for(samples)
    rows, targets, cells = [], [], Counter[tuple[str, str, str]]()
    logs: dict[tuple[str, str, str], float] = {}
    for sample in samples:
        value = sample.value(objective)
        if value is None or value <= 0 or not math.isfinite(value):
            continue
        rows.append(row(facts[sample.device_id], sample.workload, sample.config))
        targets.append(math.log(value))
        key = (str(sample.device_id), sample.workload.name, config_key(sample.config))
        cells[key] += 1
        logs[key] = logs.get(key, 0.0) + math.log(value)
    if len(rows) < 4:
        raise ValueError(f"{len(rows)} observations carry {metric}: too few to learn from")
    vectorizer = DictVectorizer(sparse=True)
    X = vectorizer.fit_transform(rows).toarray()  # noqa: N806
    regressor = BootstrapRegressor(random_state=random_state).fit(X, np.array(targets))
    return ObjectiveModel(objective, vectorizer, regressor, higher, len(rows), cells, logs)


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

    @property
    def reason(self) -> str:
        best = self.best
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
    model: ObjectiveModel | MixModel, device: DeviceFacts, workload: WorkloadSpec
) -> list[tuple[Prior, float]]:
    features = workload_features(workload)
    if isinstance(model, ObjectiveModel):
        return [(p, 1.0) for p in priors_for(device, features, model.objective)]
    weights: dict[str, float] = {}
    found: dict[str, Prior] = {}
    for part, weight in model.parts:
        for prior in priors_for(device, features, part.objective):
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
    guard: tuple[ObjectiveModel, float] | None = None,
    among: Sequence[DeviceConfig] | None = None,
) -> SearchResult:
    """Score every candidate for this device and workload (or only those `among`); see the
    module docstring."""
    grid = list(among) if among is not None else candidates(device, available)
    if current is not None and config_key(current) not in {config_key(c) for c in grid}:
        grid.append(current)
    keys = [config_key(config) for config in grid]
    rows = [row(device, workload, config) for config in grid]
    mean, std = model.predict(rows)
    members = model.members(rows)
    # how far apart the model places the candidates, before the cell's own measurements pull
    # some of them in (0 when it cannot tell them apart: then a tenth, for what it cannot see)
    spread = float(np.std(mean)) or 0.1
    # each cell's own measurements outweigh the model's prediction as they accumulate: n of
    # them against CELL_PSEUDO_COUNT for the model (a model learns a cell from the others'
    # data, and a handful of trees seldom bend to a few rows among hundreds)
    moved: list[tuple[int, float]] = []  # (observations, how far they moved the cell)
    measured: set[int] = set()
    for i, key in enumerate(keys):
        n, observed = model.observed((device_id, workload.name, key))
        if n:
            blend = n / (n + CELL_PSEUDO_COUNT)
            moved.append((n, blend * (observed - mean[i])))
            measured.add(i)
            mean[i] += blend * (observed - mean[i])
            members[:, i] += blend * (observed - members[:, i])
            std[i] *= math.sqrt(1 - blend)
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
    sign = 1.0 if model.higher_is_better else -1.0
    applicable = _priors(model, device, workload)
    # a prior moves its configuration by an effect of at least 5 % (or the spread between
    # the candidates, if larger), weighted s / (n + s): n observations of the cell outweigh it
    effect = max(spread, PRIOR_EFFECT)
    scored, utility = [], []
    for i, config in enumerate(grid):
        seen = model.cells[(device_id, workload.name, keys[i])]
        weighted = [(p, w) for p, w in applicable if _matches(p.config, config)]
        matched = tuple(p for p, _ in weighted)
        shift = sum(
            (-1 if p.avoid else 1) * w * p.strength / (seen + p.strength) for p, w in weighted
        )
        value = mean[i] + sign * shift * effect
        low, high = sorted((math.exp(mean[i] - 1.28 * std[i]), math.exp(mean[i] + 1.28 * std[i])))
        scored.append(
            ScoredConfig(config, math.exp(mean[i]), low, high, float(std[i]), seen, matched)
        )
        utility.append(sign * value)
    allowed = set(range(len(grid)))
    if guard is not None and current is not None:
        guard_model, limit = guard
        # each member's change from the current configuration, paired: what the members are
        # all unsure of alike (how this device does this workload at all) cancels, and only
        # their doubt about the difference makes a candidate look risky
        g_members = guard_model.members(rows)
        here = keys.index(config_key(current))
        change = g_members - g_members[:, [here]]
        g_sign = 1.0 if guard_model.higher_is_better else -1.0
        for i in range(len(grid)):
            if i == here:
                continue  # the yardstick: staying put is always allowed
            pessimistic = change[:, i].mean() - g_sign * change[:, i].std()
            if g_sign * pessimistic < math.log(1 - limit):
                allowed.discard(i)
    order = sorted(allowed, key=lambda i: -utility[i])
    best = scored[order[0]]
    # each member of the ensemble, with the same priors, votes for its own best
    shifts = np.array([sign * u - m for u, m in zip(utility, mean, strict=True)])
    votes = sign * (members + shifts)
    candidates_allowed = sorted(allowed)
    firsts = [candidates_allowed[int(np.argmax(v[candidates_allowed]))] for v in votes]
    confidence = sum(1 for first in firsts if first == order[0]) / len(firsts)
    # the configuration the device runs is never a canary's candidate: every canary measures
    # it anyway, as its baseline arm
    running = config_key(current) if current is not None else None
    untried = [i for i in order if scored[i].observations == 0 and keys[i] != running]
    next_canary, gain = None, 0.0
    if untried:
        # an untried cell is also uncertain for want of data: the model's spread between
        # configurations stands in for what a first canary could reveal
        ucb = {i: utility[i] + beta * math.hypot(std[i], spread) for i in untried}
        pick = max(ucb, key=lambda i: ucb[i])
        gain = math.expm1(ucb[pick] - utility[order[0]])
        if gain >= min_gain:
            next_canary = scored[pick]
    current_scored = None
    if current is not None:
        current_scored = scored[keys.index(config_key(current))]
    return SearchResult(
        model.objective,
        best,
        current_scored,
        next_canary,
        gain,
        [scored[i] for i in order],
        confidence,
    )


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
