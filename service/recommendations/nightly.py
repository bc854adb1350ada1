"""`blkpilot nightly`: retrain, re-score every device's recommendations, schedule canaries.

The service loads the data (every observation as a training sample, the present devices with
what they run), and `models.training` does the learning on Ray, in two rounds of tasks, one
task per device class and objective:
1. train: the objective's model on every observation (the classes learn from one another
   through the device features), with a cross-validation by held-out devices (cells, where
   fewer than three were measured) for its scores;
2. score: for each present device of the class, the workload it runs (its telemetry matched
   to the nearest benchmarked workload, else its most observed one), its current
   configuration, the search's recommendation under the p99 guardrail, the predicted change
   of every objective, and the configuration most worth a canary.
Then, in the caller's transaction: the model versions (with their data range and scores), the
new recommendations (superseding the device's earlier proposals for that objective), and the
canaries, ranked by expected gain (which the upper confidence bound makes grow with
uncertainty) — at most one per device.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from agent.contract.tunables import DeviceConfig
from agent.contract.wire import DeviceCapabilities
from agent.progress import note
from models.dataset import OBJECTIVE_METRIC, Sample, sample_from
from models.features import DeviceFacts, config_key
from models.grid import default_config
from models.priors import Objective
from models.search import Comparison, MixModel, ObjectiveModel, SearchResult
from models.training import (
    ScoredDevice,
    TrainedModel,
    TuningTarget,
    objectives_with_data,
    score_task,
    train_task,
    workload_of,
    workloads_in,
)
from service.audit import service as audit
from service.recommendations import repository
from service.settings import Settings
from service.tables import Device, ModelVersion, Policy, RecommendationRow, ScheduledCanary

ACTOR = "blkpilot-nightly"


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


def _device_row(device: Device) -> dict[str, Any]:
    return {
        "name": device.name,
        "device_class": device.device_class,
        "rotational": device.rotational,
        "capabilities": device.capabilities,
    }


def load_samples(
    session: Session, *, since: datetime | None = None, until: datetime | None = None
) -> list[Sample]:
    """Every observation (of present and past devices) in the time range, oldest first.
    Observations whose workload or configuration no longer validates are skipped."""
    samples = []
    for observation, device in repository.observations_with_devices(
        session, since=since, until=until
    ):
        sample = sample_from(
            observation.device_id,
            _device_row(device),
            observation.workload,
            observation.configuration,
            observation.metrics,
            observation.finished_at,
        )
        if sample is not None:
            samples.append(sample)
    return samples


def _current(device: Device, policy: Policy | None) -> DeviceConfig:
    if policy is not None:
        return DeviceConfig.model_validate(policy.config)
    capabilities = DeviceCapabilities.model_validate(device.capabilities)
    return default_config(capabilities.current_scheduler, capabilities.scheduler_tunables)


def targets(
    session: Session, samples: Sequence[Sample], now: datetime, window: timedelta
) -> tuple[list[TuningTarget], dict[str, str]]:
    """Present devices with a workload to recommend for; the others, with the reason."""
    workloads = workloads_in(samples)
    observed: dict[uuid.UUID, Counter[str]] = defaultdict(Counter)
    for sample in samples:
        observed[sample.device_id][sample.workload.name] += 1
    found, skipped = [], {}
    for device, policy in repository.present_devices_with_policies(session):
        windows = repository.window_shapes(session, device.id, now - window)
        what = workload_of(windows, workloads, observed.get(device.id, Counter()), window)
        if what is None:
            skipped[device.name] = "no telemetry and no observations to say what it runs"
            continue
        workload, basis = what
        capabilities = DeviceCapabilities.model_validate(device.capabilities)
        found.append(
            TuningTarget(
                device.id,
                device.name,
                device.device_class,
                _device_row(device),
                tuple(capabilities.available_schedulers),
                _current(device, policy),
                workload,
                basis,
                refuted_on(session, device.id, now),
            )
        )
    return found, skipped


REFUTATION_MEMORY = timedelta(days=30)


def refuted_on(session: Session, device_id: uuid.UUID, now: datetime) -> tuple[DeviceConfig, ...]:
    """Configurations whose latest canary on this device (in the last REFUTATION_MEMORY) failed:
    never recommended to it again until a canary of theirs passes — the device's own
    measurement outranks any prediction."""
    latest: dict[str, tuple[DeviceConfig, str]] = {}
    for configuration, verdict in repository.canary_verdicts(
        session, device_id, now - REFUTATION_MEMORY
    ):
        config = DeviceConfig.model_validate(configuration)
        latest[config_key(config)] = (config, verdict)
    return tuple(config for config, verdict in latest.values() if verdict == "fail")


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
    local: bool = False,
) -> NightlyReport:
    """The whole job; writes in the session's transaction (the caller commits). With `mix`
    (objective -> weight), each class also gets recommendations for that weighted mix. On
    Ray, or with `local` in this process, one task after another (the same tasks: a machine
    where Ray cannot start still gets its recommendations)."""
    now = now or datetime.now(UTC)
    samples = load_samples(session)
    chosen, skipped = targets(session, samples, now, window)
    wanted = objectives_with_data(samples, objectives)
    classes = sorted({t.device_class for t in chosen})
    run_id = uuid.uuid4()
    report = NightlyReport(run_id, "", len(samples), skipped=skipped)
    if not wanted or not classes:
        report.where = "nowhere: nothing to train on" if not wanted else "nowhere: no devices"
        return report
    note(
        "nightly: %d observations; %d devices to tune in %s; objectives %s",
        len(samples),
        len(chosen),
        ", ".join(classes),
        ", ".join(o.value for o in wanted),
    )
    if local:
        report.where = "this process (--local, without Ray)"

        def in_process(function: Callable[..., Any], jobs: list[Any], what: str) -> list[Any]:
            done = []
            for job in jobs:
                done.append(function(samples, job))
                note("nightly: %s: %d of %d (this process)", what, len(done), len(jobs))
            return done

        trained, scored = _train_and_score(classes, wanted, chosen, mix, in_process)
    else:
        from models.distributed import ray_map, ray_session

        note("nightly: starting Ray (%s)", ray_address or "local")
        with ray_session(ray_address) as where:
            report.where = where
            import ray

            shared = ray.put(samples)

            def on_ray(function: Callable[..., Any], jobs: list[Any], what: str) -> list[Any]:
                return ray_map(
                    lambda job: function(ray.get(shared), job),
                    jobs,
                    on_done=lambda n, total: note(
                        "nightly: %s: %d of %d (%s)", what, n, total, where
                    ),
                )

            trained, scored = _train_and_score(classes, wanted, chosen, mix, on_ray)
    _store(session, report, trained, scored, max_canaries)
    note(
        "nightly: %d recommendations stored (%d would change something), %d canaries scheduled",
        report.recommendations,
        report.changes,
        len(report.canaries),
    )
    return report


def _train_and_score(
    classes: list[str],
    wanted: Sequence[Objective],
    chosen: list[TuningTarget],
    mix: dict[Objective, float] | None,
    run_all: Callable[[Callable[..., Any], list[Any], str], list[Any]],
) -> tuple[list[TrainedModel], list[ScoredDevice]]:
    """Train a model per class and objective, then score every device: each step's jobs
    through `run_all(function, jobs, what)`, which runs function(samples, job) — as Ray tasks that
    fetch the samples put once (nothing here captures them: a task would carry them all), or
    in this process."""

    def train(samples: list[Sample], job: tuple[str, Objective]) -> TrainedModel:
        return train_task((samples, job[0], job[1]))

    trained: list[TrainedModel] = run_all(
        train, [(c, o) for c in classes for o in wanted], "models trained"
    )
    by_class: dict[str, dict[Objective, ObjectiveModel]] = defaultdict(dict)
    for t in trained:
        by_class[t.device_class][t.objective] = t.model
    scoring: list[tuple[str, str, ObjectiveModel | MixModel]] = [
        (t.device_class, t.objective.value, t.model) for t in trained
    ]
    for device_class, models in by_class.items():
        if mix and all(o in models for o in mix):
            scoring.append((device_class, "mix", MixModel.of(models, mix)))

    # each model's cross-validated skill (a mix: its heaviest part's): none, and the search
    # keeps the current configuration or the class's rule (models.search.recommend)
    skills = {(t.device_class, t.objective.value): t.scores.get("r2_log") for t in trained}
    lead_of = {"mix": max(mix.items(), key=lambda kv: kv[1])[0].value} if mix else {}

    def score(
        samples: list[Sample], job: tuple[str, str, ObjectiveModel | MixModel]
    ) -> list[ScoredDevice]:
        device_class, label, model = job
        mine = [x for x in chosen if x.device_class == device_class]
        skill = skills.get((device_class, lead_of.get(label, label)))
        return score_task((samples, label, model, by_class[device_class], mine, skill))

    scored = [
        s for batch in run_all(score, scoring, "models that scored their devices") for s in batch
    ]
    return trained, scored


def _store(
    session: Session,
    report: NightlyReport,
    trained: list[TrainedModel],
    scored: list[ScoredDevice],
    max_canaries: int,
) -> None:
    """The night's models, recommendations and scheduled canaries, and its audit record."""
    versions = _store_models(session, report, trained)
    _store_recommendations(session, report, trained, scored, versions)
    _schedule_canaries(session, report, scored, max_canaries)
    audit.record(
        session,
        ACTOR,
        "nightly.run",
        target_type="nightly_run",
        target_id=report.run_id,
        after={
            "models": len(trained),
            "recommendations": report.recommendations,
            "canaries": len(report.canaries),
            "samples": report.samples,
        },
        detail=f"ran on {report.where}",
    )


def _store_models(
    session: Session, report: NightlyReport, trained: list[TrainedModel]
) -> dict[tuple[str, str], ModelVersion]:
    """A model version per device class and objective trained tonight, by both."""
    versions: dict[tuple[str, str], ModelVersion] = {}
    for t in trained:
        version = ModelVersion(
            run_id=report.run_id,
            device_class=t.device_class,
            objective=t.objective.value,
            rows=t.model.rows,
            cells=len({c[:2] for c in t.model.cells}),
            data_from=t.data_from,
            data_until=t.data_until,
            scores=t.scores,
            parameters={
                "estimator": "BootstrapRegressor(HistGradientBoostingRegressor)",
                "members": t.model.regressor.n_estimators,
                "metric": OBJECTIVE_METRIC[t.objective][0],
                "log_scale": True,
            },
        )
        repository.add(session, version)
        versions[(t.device_class, t.objective.value)] = version
        report.models.append(
            {
                "device_class": t.device_class,
                "objective": t.objective.value,
                "rows": t.model.rows,
                **t.scores,
            }
        )
    repository.flush(session)
    return versions


def _store_recommendations(
    session: Session,
    report: NightlyReport,
    trained: list[TrainedModel],
    scored: list[ScoredDevice],
    versions: dict[tuple[str, str], ModelVersion],
) -> None:
    """The night's recommendations, a device's proposals before them superseded."""
    # one recommendation per device and configuration: a change best for several objectives
    # is one decision, shown with its predicted effect on each (the lead objective's row)
    by_device: dict[uuid.UUID, list[ScoredDevice]] = defaultdict(list)
    for item in scored:
        by_device[item.target.device_id].append(item)
    models_by = {(t.device_class, t.objective.value): t.model for t in trained}
    for device_id, items in by_device.items():
        repository.supersede_proposals(
            session, device_id, objectives=sorted({i.objective for i in items})
        )
        groups: dict[str, list[ScoredDevice]] = defaultdict(list)
        for item in sorted(items, key=lambda i: _objective_order(i.objective)):
            groups[config_key(item.recommendation.best.config)].append(item)
        for group in groups.values():
            repository.add(session, _recommendation_row(group, models_by, versions))
            lead = group[0]
            report.recommendations += 1
            report.changes += int(
                config_key(lead.recommendation.best.config) != config_key(lead.target.current)
            )


def _recommendation_row(
    group: list[ScoredDevice],
    models_by: dict[tuple[str, str], ObjectiveModel],
    versions: dict[tuple[str, str], ModelVersion],
) -> RecommendationRow:
    """One device's recommendation of one configuration, best for each objective in group
    (the lead objective first): its predicted effect on each, its evidence and its reason."""
    lead, rest = group[0], group[1:]
    target, rec = lead.target, lead.recommendation
    objectives = [i.objective for i in group]
    mixed = [str(i.recommendation.objective) for i in group if i.objective == "mix"]
    mixes = {"mix": mixed[0]} if mixed else {}
    # the mix's own model is not a trained one: the lead part's intervals stand for it
    model = models_by.get((target.device_class, lead.model_objective))
    return RecommendationRow(
        device_id=target.device_id,
        model_version_id=versions[(target.device_class, lead.model_objective)].id,
        objective=lead.objective,
        objectives=objectives,
        workload_name=target.workload.name,
        workload_basis=target.basis,
        current_config=target.current.model_dump(mode="json", exclude_none=True),
        recommended_config=rec.best.config.model_dump(mode="json", exclude_none=True),
        predictions={c.objective.value: _comparison(c) for c in lead.comparisons},
        confidence=rec.confidence,
        evidence={
            "observations_of_cell": rec.best.observations,
            "model_rows": rec_rows(rec),
            "priors": [
                {
                    "name": p.name,
                    "reason": p.reason,
                    "citation": p.citation,
                    "avoid": p.avoid,
                }
                for p in rec.best.priors
            ],
            "device_facts": _facts(lead.facts),
            "agreement": {i.objective: round(i.recommendation.confidence, 3) for i in group},
            "intervals": _intervals(model),
            # the lead model's cross-validated skill on held-out devices or cells (R²
            # of the log metric): at or below zero it predicts no better than the mean
            "skill": {
                "r2_log": versions[(target.device_class, lead.model_objective)].scores.get("r2_log")
            },
            # the model's pick, or, where its evidence is weak, the class's rule
            "basis": rec.basis,
            "doubts": list(rec.doubts),
            **mixes,
        },
        reason="; ".join(
            [rec.reason] + [f"also best for {i.objective}: {i.recommendation.reason}" for i in rest]
        ),
        next_canary=rec.next_canary.config.model_dump(mode="json", exclude_none=True)
        if rec.next_canary
        else None,
        expected_gain=rec.expected_gain,
        status="proposed",
    )


def _schedule_canaries(
    session: Session, report: NightlyReport, scored: list[ScoredDevice], max_canaries: int
) -> None:
    # canaries: the most promising first, one per device, replacing the last run's
    repository.cancel_scheduled_canaries(session)
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
        repository.add(
            session,
            ScheduledCanary(
                run_id=report.run_id,
                device_id=item.target.device_id,
                objective=item.objective,
                workload_name=item.target.workload.name,
                workload=item.target.workload.model_dump(mode="json"),
                config=canary.config.model_dump(mode="json", exclude_none=True),
                expected_gain=item.recommendation.expected_gain,
                uncertainty=canary.std,
                rank=len(taken),
                status="scheduled",
            ),
        )
        gain = round(item.recommendation.expected_gain, 4)
        report.canaries.append(
            {
                "device": item.target.name,
                "objective": item.objective,
                "config": config_key(canary.config),
                "expected_gain": gain,
            }
        )


def run_in_database(settings: Settings, **options: Any) -> NightlyReport:
    """The job in one transaction of the configured database (embedded if none is set)."""
    from service import db
    from service.runtime import database_url

    with database_url(settings) as url:
        engine = db.create_db_engine(url, pool_size=2, max_overflow=0)
        try:
            with Session(engine) as session, session.begin():
                return run(session, **options)
        finally:
            engine.dispose()


def rec_rows(rec: SearchResult) -> int:
    return sum(s.observations for s in rec.ranked)


def _objective_order(objective: str) -> int:
    """The lead objective of a recommendation serving several: the order they are listed in."""
    order = [o.value for o in Objective] + ["mix"]
    return order.index(objective) if objective in order else len(order)


def _intervals(model: ObjectiveModel | None) -> dict[str, Any]:
    """What the shown intervals claim, and what they covered on cells the model had not seen."""
    if model is None or not model.calibration.units:
        return {"claimed": 0.8, "calibrated": False}
    return {
        "claimed": 0.8,
        "calibrated": True,
        "held_out_coverage": model.calibration.coverage,
        "calibrated_on": model.calibration.units,
    }


def _comparison(c: Comparison) -> dict[str, Any]:
    return {
        # in full: the reason's and the page's figures are formatted from the same number
        # (rounding here first made 9.7205 read "9.72" on the card and "9.721" in the reason)
        "current": c.current,
        "recommended": c.recommended,
        "change": round(c.change, 4),
        "change_low": round(c.change_low, 4),
        "change_high": round(c.change_high, 4),
        "higher_is_better": c.higher_is_better,
        "metric": OBJECTIVE_METRIC[c.objective][0],
    }


def _facts(facts: DeviceFacts) -> dict[str, Any]:
    return {
        "device_class": facts.device_class.value,
        "qd1_read_us": facts.qd1_read_us,
        "write_over_read": facts.write_over_read,
        "parallel_speedup": facts.parallel_speedup,
        "poll_queues": facts.poll_queues,
    }
