"""`blkpilot nightly`: retrain, re-score every device's recommendations, schedule canaries.

On Ray, in two rounds of tasks, one task per device class and objective:
1. train: the objective's model on every observation (the classes learn from one another
   through the device features), with a cross-validation by held-out cells for its scores;
2. score: for each present device of the class, the workload it runs (its telemetry matched
   to the nearest benchmarked workload, else its most observed one), its current
   configuration, the search's recommendation under the p99 guardrail, the predicted change
   of every objective, and the configuration most worth a canary.
Then, in one transaction: the model versions (with their data range and scores), the new
recommendations (superseding the device's earlier proposals for that objective), and the
canaries, ranked by expected gain (which the upper confidence bound makes grow with
uncertainty) — at most one per device.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from agent.wire import DeviceCapabilities, DeviceConfig, Scheduler, WorkloadSpec
from models import mapping
from models.dataset import OBJECTIVE_METRIC, Sample, facts_for, load
from models.features import DeviceFacts, config_key, row
from models.grid import default_config
from models.priors import Objective
from models.search import (
    Comparison,
    MixModel,
    ObjectiveModel,
    Recommendation,
    compare,
    fit,
    recommend,
)
from service.audit import service as audit
from service.tables import (
    Device,
    ModelVersion,
    Policy,
    ScheduledCanary,
    TelemetryWindow,
)
from service.tables import Recommendation as RecommendationRow

GUARD = (Objective.P99, 0.10)  # other objectives may not cost more than 10 % of p99
ACTOR = "blkpilot-nightly"


@dataclass(frozen=True)
class Target:
    """A device to recommend for, and what it does."""

    device_id: uuid.UUID
    name: str
    device_class: str
    row: dict[str, Any]
    available: tuple[Scheduler, ...]
    current: DeviceConfig
    workload: WorkloadSpec
    basis: str


@dataclass
class Trained:
    device_class: str
    objective: Objective
    model: ObjectiveModel
    scores: dict[str, Any]
    data_from: datetime | None
    data_until: datetime | None


@dataclass
class Scored:
    target: Target
    objective: str  # an Objective's value, or "mix"
    recommendation: Recommendation
    comparisons: list[Comparison]
    facts: DeviceFacts
    model_objective: str  # whose model version it came from (a mix: its heaviest part's)


@dataclass
class NightlyReport:
    run_id: uuid.UUID
    where: str
    samples: int
    models: list[dict[str, Any]] = field(default_factory=list)
    recommendations: int = 0
    changes: int = 0  # recommendations that differ from the current configuration
    canaries: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # device -> why


# --- what the job works on ------------------------------------------------------------------


def _current(device: Device, policy: Policy | None) -> DeviceConfig:
    if policy is not None:
        return DeviceConfig.model_validate(policy.config)
    capabilities = DeviceCapabilities.model_validate(device.capabilities)
    return default_config(capabilities.current_scheduler, capabilities.scheduler_tunables)


def targets(
    session: Session, samples: Sequence[Sample], now: datetime, window: timedelta
) -> tuple[list[Target], dict[str, str]]:
    """Present devices with a workload to recommend for; the others, with the reason."""
    workloads: dict[str, WorkloadSpec] = {}
    observed: dict[uuid.UUID, Counter[str]] = defaultdict(Counter)
    for sample in samples:
        workloads.setdefault(sample.workload.name, sample.workload)
        observed[sample.device_id][sample.workload.name] += 1
    found, skipped = [], {}
    policies = {p.device_id: p for p in session.scalars(select(Policy))}
    for device in session.scalars(select(Device).where(Device.present.is_(True))):
        rows = session.execute(
            select(TelemetryWindow.iops, TelemetryWindow.read_ios, TelemetryWindow.write_ios,
                   TelemetryWindow.read_share, TelemetryWindow.mean_request_bytes,
                   TelemetryWindow.queue_depth)
            .where(TelemetryWindow.device_id == device.id,
                   TelemetryWindow.window_end >= now - window)
        ).mappings()  # fmt: skip
        windows = [dict(r) for r in rows]
        match = mapping.nearest(windows, workloads.values())
        if match:
            shape = match[0].observed
            workload = match[0].workload
            basis = (
                f"telemetry: {len(windows)} windows in the last {window.total_seconds() / 3600:g}"
                f" h, {shape.read_share:.0%} reads of {shape.request_kib:.0f} KiB,"
                f" {shape.in_flight:.1f} in flight; nearest benchmarked workload {workload.name}"
                f" (distance {match[0].distance:.2f})"
            )
        elif observed.get(device.id):
            name, count = observed[device.id].most_common(1)[0]
            workload = workloads[name]
            basis = f"no busy telemetry; its most observed workload ({count} observations)"
        else:
            skipped[device.name] = "no telemetry and no observations to say what it runs"
            continue
        capabilities = DeviceCapabilities.model_validate(device.capabilities)
        found.append(
            Target(
                device.id, device.name, device.device_class,
                {"name": device.name, "device_class": device.device_class,
                 "rotational": device.rotational, "capabilities": device.capabilities},
                tuple(capabilities.available_schedulers), _current(device, policies.get(device.id)),
                workload, basis,
            )
        )  # fmt: skip
    return found, skipped


def objectives_with_data(samples: Sequence[Sample], wanted: Sequence[Objective]) -> list[Objective]:
    found = []
    for objective in wanted:
        rows = sum(1 for s in samples if (v := s.value(objective)) is not None and v > 0)
        if rows >= 4:
            found.append(objective)
    return found


# --- the Ray tasks --------------------------------------------------------------------------


def cross_validate(samples: list[Sample], objective: Objective, folds: int = 3) -> dict[str, Any]:
    """Held-out cells (device, workload): typical error of the log prediction, R², and how
    often the truth fell inside the 80 % interval."""
    cells = sorted({(str(s.device_id), s.workload.name) for s in samples
                    if s.value(objective) is not None})  # fmt: skip
    if len(cells) < folds:
        return {"folds": 0, "note": f"{len(cells)} cells: too few to hold any out"}
    errors, truths, predictions, inside = [], [], [], 0
    for k in range(folds):
        held = set(cells[k::folds])
        train = [s for s in samples if (str(s.device_id), s.workload.name) not in held]
        test = [s for s in samples if (str(s.device_id), s.workload.name) in held]
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
        for sample, m, sd in zip(test, mean, std, strict=True):
            truth = math.log(sample.value(objective) or 1.0)
            errors.append(abs(truth - m))
            truths.append(truth)
            predictions.append(m)
            inside += int(abs(truth - m) <= 1.28 * max(sd, 1e-9))
    if not errors:
        return {"folds": 0, "note": "no fold could be trained"}
    t, p = np.array(truths), np.array(predictions)
    total = float(((t - t.mean()) ** 2).sum())
    return {
        "folds": folds,
        "held_out_rows": len(errors),
        "typical_error": round(math.expm1(float(np.median(errors))), 4),  # as a ratio
        "r2_log": round(1 - float(((t - p) ** 2).sum()) / total, 4) if total > 0 else None,
        "interval_80_coverage": round(inside / len(errors), 3),
    }


def train_task(job: tuple[list[Sample], str, Objective]) -> Trained:
    samples, device_class, objective = job
    model = fit(samples, objective)
    times = [s.finished_at for s in samples if s.value(objective) is not None]
    return Trained(device_class, objective, model, cross_validate(samples, objective),
                   min(times, default=None), max(times, default=None))  # fmt: skip


def score_task(
    job: tuple[list[Sample], str, ObjectiveModel | MixModel, dict[Objective, ObjectiveModel],
               list[Target]],
) -> list[Scored]:  # fmt: skip
    samples, label, model, others, chosen = job
    lead = (label if isinstance(model, ObjectiveModel)
            else max(model.parts, key=lambda part: part[1])[0].objective.value)  # fmt: skip
    facts = facts_for(samples)
    guard_objective, limit = GUARD
    guard = others.get(guard_objective) if label != guard_objective.value else None
    scored = []
    for target in chosen:
        device = facts.get(target.device_id) or DeviceFacts.from_inventory(target.row, {})
        if label == Objective.FAIRNESS.value and target.workload.tasks < 2:
            continue  # fairness is between tasks
        rec = recommend(
            model, str(target.device_id), device, target.workload, target.available,
            current=target.current, guard=(guard, limit) if guard is not None else None,
        )  # fmt: skip
        comparisons = [
            compare(model, device, target.workload, target.current, rec.best.config)
            for objective, model in sorted(others.items())
            if objective is not Objective.FAIRNESS or target.workload.tasks > 1
        ]
        scored.append(Scored(target, label, rec, comparisons, device, lead))
    return scored


# --- the job --------------------------------------------------------------------------------


def run(
    session: Session,
    *,
    objectives: Sequence[Objective] = tuple(Objective),
    ray_address: str | None = None,
    window: timedelta = timedelta(hours=24),
    max_canaries: int = 10,
    now: datetime | None = None,
    mix: dict[Objective, float] | None = None,
) -> NightlyReport:
    """The whole job; writes in the session's transaction (the caller commits). With `mix`
    (objective -> weight), each class also gets recommendations for that weighted mix."""
    from models.distributed import ray_map, ray_session

    now = now or datetime.now(UTC)
    samples = load(session)
    chosen, skipped = targets(session, samples, now, window)
    wanted = objectives_with_data(samples, objectives)
    classes = sorted({t.device_class for t in chosen})
    run_id = uuid.uuid4()
    report = NightlyReport(run_id, "", len(samples), skipped=skipped)
    if not wanted or not classes:
        report.where = "nowhere: nothing to train on" if not wanted else "nowhere: no devices"
        return report
    with ray_session(ray_address) as where:
        report.where = where
        import ray

        shared = ray.put(samples)

        def train(job: tuple[str, Objective]) -> Trained:
            return train_task((ray.get(shared), job[0], job[1]))

        jobs = [(c, o) for c in classes for o in wanted]
        trained = ray_map(train, jobs)
        by_class: dict[str, dict[Objective, ObjectiveModel]] = defaultdict(dict)
        for t in trained:
            by_class[t.device_class][t.objective] = t.model

        scoring: list[tuple[str, str, ObjectiveModel | MixModel]] = [
            (t.device_class, t.objective.value, t.model) for t in trained
        ]
        for device_class, models in by_class.items():
            if mix and all(o in models for o in mix):
                scoring.append((device_class, "mix", MixModel.of(models, mix)))

        def score(job: tuple[str, str, ObjectiveModel | MixModel]) -> list[Scored]:
            device_class, label, model = job
            mine = [x for x in chosen if x.device_class == device_class]
            return score_task((ray.get(shared), label, model, by_class[device_class], mine))

        scored = [s for batch in ray_map(score, scoring) for s in batch]
    _store(session, report, trained, scored, max_canaries)
    return report


def _store(
    session: Session,
    report: NightlyReport,
    trained: list[Trained],
    scored: list[Scored],
    max_canaries: int,
) -> None:
    versions: dict[tuple[str, str], ModelVersion] = {}
    for t in trained:
        version = ModelVersion(
            run_id=report.run_id, device_class=t.device_class, objective=t.objective.value,
            rows=t.model.rows, cells=len({c[:2] for c in t.model.cells}),
            data_from=t.data_from, data_until=t.data_until, scores=t.scores,
            parameters={"estimator": "BootstrapRegressor(HistGradientBoostingRegressor)",
                        "members": t.model.regressor.n_estimators,
                        "metric": OBJECTIVE_METRIC[t.objective][0], "log_scale": True},
        )  # fmt: skip
        session.add(version)
        versions[(t.device_class, t.objective.value)] = version
        report.models.append({"device_class": t.device_class, "objective": t.objective.value,
                              "rows": t.model.rows, **t.scores})  # fmt: skip
    session.flush()
    for item in scored:
        target, rec = item.target, item.recommendation
        session.execute(
            update(RecommendationRow)
            .where(RecommendationRow.device_id == target.device_id,
                   RecommendationRow.objective == item.objective,
                   RecommendationRow.status == "proposed")
            .values(status="superseded")
        )  # fmt: skip
        row = RecommendationRow(
            device_id=target.device_id,
            model_version_id=versions[(target.device_class, item.model_objective)].id,
            objective=item.objective, workload_name=target.workload.name,
            workload_basis=target.basis,
            current_config=target.current.model_dump(mode="json", exclude_none=True),
            recommended_config=rec.best.config.model_dump(mode="json", exclude_none=True),
            predictions={c.objective.value: _comparison(c) for c in item.comparisons},
            confidence=rec.confidence,
            evidence={"observations_of_cell": rec.best.observations,
                      "model_rows": rec_rows(rec),
                      "priors": [{"name": p.name, "reason": p.reason, "citation": p.citation,
                                  "avoid": p.avoid} for p in rec.best.priors],
                      "device_facts": _facts(item.facts),
                      **({"mix": item.recommendation.objective} if item.objective == "mix"
                         else {})},
            reason=rec.reason,
            next_canary=rec.next_canary.config.model_dump(mode="json", exclude_none=True)
            if rec.next_canary else None,
            expected_gain=rec.expected_gain, status="proposed",
        )  # fmt: skip
        session.add(row)
        report.recommendations += 1
        report.changes += int(config_key(rec.best.config) != config_key(target.current))
    # canaries: the most promising first, one per device, replacing the last run's
    session.execute(
        update(ScheduledCanary).where(ScheduledCanary.status == "scheduled")
        .values(status="cancelled")
    )  # fmt: skip
    wanting = sorted(
        (s for s in scored if s.recommendation.next_canary is not None),
        key=lambda s: -s.recommendation.expected_gain,
    )
    taken: set[uuid.UUID] = set()
    for item in wanting:
        if len(taken) >= max_canaries:
            break
        if item.target.device_id in taken:
            continue
        taken.add(item.target.device_id)
        canary = item.recommendation.next_canary
        assert canary is not None
        session.add(ScheduledCanary(
            run_id=report.run_id, device_id=item.target.device_id,
            objective=item.objective, workload_name=item.target.workload.name,
            workload=item.target.workload.model_dump(mode="json"),
            config=canary.config.model_dump(mode="json", exclude_none=True),
            expected_gain=item.recommendation.expected_gain, uncertainty=canary.std,
            rank=len(taken), status="scheduled",
        ))  # fmt: skip
        gain = round(item.recommendation.expected_gain, 4)
        report.canaries.append(
            {"device": item.target.name, "objective": item.objective,
             "config": config_key(canary.config), "expected_gain": gain}
        )  # fmt: skip
    audit.record(
        session, ACTOR, "nightly.run", target_type="nightly_run", target_id=report.run_id,
        after={"models": len(trained), "recommendations": report.recommendations,
               "canaries": len(report.canaries), "samples": report.samples},
        detail=f"ran on {report.where}",
    )  # fmt: skip


def rec_rows(rec: Recommendation) -> int:
    return sum(s.observations for s in rec.ranked)


def _comparison(c: Comparison) -> dict[str, Any]:
    return {"current": round(c.current, 4), "recommended": round(c.recommended, 4),
            "change": round(c.change, 4), "change_low": round(c.change_low, 4),
            "change_high": round(c.change_high, 4), "higher_is_better": c.higher_is_better,
            "metric": OBJECTIVE_METRIC[c.objective][0]}  # fmt: skip


def _facts(facts: DeviceFacts) -> dict[str, Any]:
    return {"device_class": facts.device_class.value, "qd1_read_us": facts.qd1_read_us,
            "write_over_read": facts.write_over_read, "parallel_speedup": facts.parallel_speedup,
            "poll_queues": facts.poll_queues}  # fmt: skip
