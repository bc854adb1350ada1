"""The nightly job's learning, over plain data: which objectives have data, a model per device
class and objective with held-out scores, and each device's recommendation under the p99
guardrail with the predicted change of every objective. The service loads the data, runs these
as Ray tasks and stores what they return (service/recommendations/nightly.py)."""

from __future__ import annotations

import math
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.workloads import WorkloadSpec
from models import mapping
from models.dataset import Sample, facts_for
from models.features import DeviceFacts, config_key, row
from models.priors import Objective
from models.search import (
    Z80,
    Comparison,
    MixModel,
    ObjectiveModel,
    SearchResult,
    candidates,
    class_rule,
    compare,
    fit,
    recommend,
)

GUARD = (Objective.P99, 0.10)  # other objectives may not cost more than 10 % of p99


@dataclass(frozen=True)
class TuningTarget:
    """A device to recommend for, and what it does."""

    device_id: uuid.UUID
    name: str
    device_class: str
    row: dict[str, Any]
    available: tuple[Scheduler, ...]
    current: DeviceConfig
    workload: WorkloadSpec
    basis: str
    refuted: tuple[DeviceConfig, ...] = ()  # failed their canary on it: never recommended


@dataclass
class TrainedModel:
    device_class: str
    objective: Objective
    model: ObjectiveModel
    scores: dict[str, Any]
    data_from: datetime | None
    data_until: datetime | None


@dataclass
class ScoredDevice:
    target: TuningTarget
    objective: str  # an Objective's value, or "mix"
    recommendation: SearchResult
    comparisons: list[Comparison]
    facts: DeviceFacts
    model_objective: str  # whose model version it came from (a mix: its heaviest part's)


def workload_of(
    windows: Sequence[Mapping[str, Any]],
    workloads: Mapping[str, WorkloadSpec],
    observed: Mapping[str, int],
    window: timedelta,
) -> tuple[WorkloadSpec, str] | None:
    """What a device runs, with the basis for saying so: its telemetry matched to the nearest
    benchmarked workload, else its most observed workload; None when neither says."""
    match = mapping.nearest(windows, workloads.values())
    if match:
        shape = match[0].observed
        workload = match[0].workload
        return workload, (
            f"telemetry: {len(windows)} windows in the last {window.total_seconds() / 3600:g}"
            f" h, {shape.read_share:.0%} reads of {shape.request_kib:.0f} KiB,"
            f" {shape.in_flight:.1f} in flight; nearest benchmarked workload {workload.name}"
            f" (distance {match[0].distance:.2f})"
        )
    if observed:
        name, count = Counter(observed).most_common(1)[0]
        return workloads[name], (
            f"no busy telemetry; its most observed workload ({count} observations)"
        )
    return None


def workloads_in(samples: Iterable[Sample]) -> dict[str, WorkloadSpec]:
    found: dict[str, WorkloadSpec] = {}
    for sample in samples:
        found.setdefault(sample.workload.name, sample.workload)
    return found


def objectives_with_data(samples: Sequence[Sample], wanted: Sequence[Objective]) -> list[Objective]:
    found = []
    for objective in wanted:
        rows = sum(1 for s in samples if (v := s.value(objective)) is not None and v > 0)
        if rows >= 4:
            found.append(objective)
    return found


# --- the Ray tasks --------------------------------------------------------------------------


def cross_validate(samples: list[Sample], objective: Objective, folds: int = 3) -> dict[str, Any]:
    """Held-out devices — every cell of a device out of training together, as a device the
    model has never seen is what a recommendation before its first canary faces — where the
    samples have at least `folds` devices, else held-out cells (device, workload): typical error
    of the log prediction, R², and how often a configuration's mean in a held-out cell fell
    inside its 80 % interval — the calibrated interval the dashboard shows, and the members'
    own spread for comparison. `held_out` says which."""
    cells = sorted(
        {(str(s.device_id), s.workload.name) for s in samples if s.value(objective) is not None}
    )
    if len(cells) < folds:
        return {"folds": 0, "note": f"{len(cells)} cells: too few to hold any out"}
    devices = sorted({device for device, _ in cells})
    by_device = len(devices) >= folds

    def group_of(sample: Sample) -> object:
        cell = (str(sample.device_id), sample.workload.name)
        return cell[0] if by_device else cell

    groups: list[Any] = list(devices) if by_device else list(cells)
    errors, truths, predictions = [], [], []
    inside = inside_raw = units = 0
    for k in range(folds):
        held = set(groups[k::folds])
        train = [s for s in samples if group_of(s) not in held]
        test = [s for s in samples if group_of(s) in held]
        test = [s for s in test if (v := s.value(objective)) is not None and v > 0]
        try:
            model = fit(train, objective)
        except ValueError:
            continue
        facts = facts_for(train + test)
        rows = [row(facts[s.device_id], s.workload, s.config) for s in test]
        if not rows:
            continue
        mean, std = model.predict(rows)
        per_unit: dict[tuple[str, str, str], list[tuple[float, float, float]]] = defaultdict(list)
        for sample, m, sd in zip(test, mean, std, strict=True):
            truth = math.log(sample.value(objective) or 1.0)
            errors.append(abs(truth - m))
            truths.append(truth)
            predictions.append(m)
            unit = (str(sample.device_id), sample.workload.name, config_key(sample.config))
            per_unit[unit].append((truth, float(m), float(sd)))
        for found in per_unit.values():
            truth = float(np.mean([t for t, _, _ in found]))
            _, m, sd = found[0]
            units += 1
            inside += int(abs(truth - m) <= model.calibration.value_half_width(sd))
            inside_raw += int(abs(truth - m) <= Z80 * sd)
    if not errors:
        return {"folds": 0, "note": "no fold could be trained"}
    t, p = np.array(truths), np.array(predictions)
    total = float(((t - t.mean()) ** 2).sum())
    return {
        "folds": folds,
        "held_out": "devices" if by_device else "cells",
        "held_out_rows": len(errors),
        "typical_error": round(math.expm1(float(np.median(errors))), 4),  # as a ratio
        "r2_log": round(1 - float(((t - p) ** 2).sum()) / total, 4) if total > 0 else None,
        "interval_80_coverage": round(inside / units, 3),
        "interval_80_coverage_uncalibrated": round(inside_raw / units, 3),
    }


def train_task(job: tuple[list[Sample], str, Objective]) -> TrainedModel:
    samples, device_class, objective = job
    model = fit(samples, objective)
    times = [s.finished_at for s in samples if s.value(objective) is not None]
    return TrainedModel(
        device_class,
        objective,
        model,
        cross_validate(samples, objective),
        min(times, default=None),
        max(times, default=None),
    )


def score_task(
    job: tuple[
        list[Sample],
        str,
        ObjectiveModel | MixModel,
        dict[Objective, ObjectiveModel],
        list[TuningTarget],
        float | None,
    ],
) -> list[ScoredDevice]:
    """Each chosen device's recommendation by this model. `skill` is the model's cross-
    validated R² (the lead part's for a mix): where it is not positive, or the evidence is
    otherwise weak, recommend() keeps the current configuration or the class's rule."""
    samples, label, model, others, chosen, skill = job
    lead = (
        label
        if isinstance(model, ObjectiveModel)
        else max(model.parts, key=lambda part: part[1])[0].objective.value
    )
    facts = facts_for(samples)
    guard_objective, limit = GUARD
    guard = others.get(guard_objective) if label != guard_objective.value else None
    rules: dict[str, DeviceConfig | None] = {}

    def rule_for(device_class: str) -> DeviceConfig | None:
        """The class's rule for the lead objective, from its devices' cells (every device's
        where none of its class has been measured)."""
        if device_class not in rules:
            same = [s for s in samples if s.device.get("device_class") == device_class]
            rules[device_class] = class_rule(same or samples, Objective(lead))
        return rules[device_class]

    scored = []
    for target in chosen:
        device = facts.get(target.device_id) or DeviceFacts.from_inventory(target.row, {})
        if label == Objective.FAIRNESS.value and target.workload.tasks < 2:
            continue  # fairness is between tasks
        refuted = {config_key(c) for c in target.refuted}
        among = (
            [c for c in candidates(device, target.available) if config_key(c) not in refuted]
            if refuted
            else None
        )
        rec = recommend(
            model,
            str(target.device_id),
            device,
            target.workload,
            target.available,
            current=target.current,
            guard=(guard, limit) if guard is not None else None,
            among=among,
            fallback=rule_for(target.device_class),
            skill=skill,
        )
        comparisons = [
            compare(
                model,
                str(target.device_id),
                device,
                target.workload,
                target.available,
                target.current,
                rec.best.config,
            )
            for objective, model in sorted(others.items())
            if objective is not Objective.FAIRNESS or target.workload.tasks > 1
        ]
        scored.append(ScoredDevice(target, label, rec, comparisons, device, lead))
    return scored
