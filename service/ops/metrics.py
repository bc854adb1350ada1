"""The service's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.pool import QueuePool

REGISTRY = CollectorRegistry(auto_describe=True)

RATE_LIMITED = Counter(
    "blkpilot_rate_limited_requests",
    "Requests refused with 429 for passing their caller's rate limit, by kind of caller.",
    ["caller"],
    registry=REGISTRY,
)
HTTP_REQUESTS = Counter(
    "blkpilot_http_requests",
    "HTTP requests handled, by route template, method and status code.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "blkpilot_http_request_duration_seconds",
    "Time from request received to response sent, by route template and method.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
TELEMETRY_BATCHES = Counter(
    "blkpilot_telemetry_batches",
    "Telemetry batches by outcome: accepted (stored), duplicate (seen before), rejected.",
    ["outcome"],
    registry=REGISTRY,
)
TELEMETRY_PUSH_PATH = Counter(
    "blkpilot_telemetry_push_path",
    "Telemetry pushes by the way they were taken: event_loop (stored by one statement on the"
    " event loop), unit_of_work (in a worker thread's unit of work: a node's first push, a new"
    " day, a refusal, a batch id seen before), connection_failed (an event-loop connection"
    " failed; the push was then taken in a unit of work).",
    ["path"],
    registry=REGISTRY,
)
TELEMETRY_PUSH_LEAN = Counter(
    "blkpilot_telemetry_push_lean",
    "Telemetry pushes at the lean path (service.telemetry.fastpath), by outcome: answered"
    " there, or handed to the framework's route — token_not_held (a token this process has"
    " not checked lately, or not a node's), not_json, no_event_loop_path, disconnected,"
    " model_judges (a body the fast decoder left to the model), unit_of_work (the event"
    " loop's statement did not take it: a first push, a new day, a batch id seen before).",
    ["outcome"],
    registry=REGISTRY,
)
# every eBPF window's device-time p99 as it is ingested: the fleet's latency distribution
WINDOW_P99 = Histogram(
    "blkpilot_fleet_window_p99_seconds",
    "Device-time p99 of each ingested telemetry window that carries eBPF distributions.",
    buckets=[(1 << k) / 1e9 for k in range(10, 31, 2)],
    registry=REGISTRY,
)
TELEMETRY_WINDOWS = Counter(
    "blkpilot_telemetry_windows_ingested",
    "Telemetry windows stored (counted after their transaction committed).",
    registry=REGISTRY,
)
TELEMETRY_UPKEEP = Counter(
    "blkpilot_telemetry_upkeep_passes",
    "Telemetry upkeep passes (partitions ahead, rollups, retention) by outcome: ran, skipped"
    " (another replica's pass held the lock), failed.",
    ["outcome"],
    registry=REGISTRY,
)
TELEMETRY_ROLLUP_UNREADABLE = Counter(
    "blkpilot_telemetry_rollup_unreadable_histograms",
    "Device-hours rolled up without their eBPF histograms, which did not parse as ingest"
    " stores them (their sums are rolled up; no other device-hour is affected).",
    registry=REGISTRY,
)
TELEMETRY_ROLLUP_FAILURES = Counter(
    "blkpilot_telemetry_rollup_failed_hours",
    "Hours the telemetry upkeep could not roll up: recorded in telemetry_rollup_failures and"
    " moved past (their raw windows set aside when their day is dropped).",
    registry=REGISTRY,
)
TELEMETRY_PARTITIONS = Counter(
    "blkpilot_telemetry_partitions",
    "Telemetry partitions this process created or dropped.",
    ["action"],
    registry=REGISTRY,
)
for _outcome in ("ran", "skipped", "failed"):
    TELEMETRY_UPKEEP.labels(outcome=_outcome)
for _action in ("created", "dropped"):
    TELEMETRY_PARTITIONS.labels(action=_action)


class DatabasePoolCollector(Collector):
    """Connection pool state, read at scrape time from the engine in use."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pool = self.engine.pool if self.engine is not None else None
        if not isinstance(pool, QueuePool):
            return
        yield GaugeMetricFamily(
            "blkpilot_db_pool_size", "Connections the pool keeps open.", value=pool.size()
        )
        yield GaugeMetricFamily(
            "blkpilot_db_pool_checked_out",
            "Connections in use by requests.",
            value=pool.checkedout(),
        )
        yield GaugeMetricFamily(
            "blkpilot_db_pool_checked_in", "Idle connections in the pool.", value=pool.checkedin()
        )
        yield GaugeMetricFamily(
            "blkpilot_db_pool_overflow",
            "Connections open beyond the pool size (negative: pool not yet full).",
            value=pool.overflow(),
        )


DB_POOL = DatabasePoolCollector()
REGISTRY.register(DB_POOL)


class FleetCollector(Collector):
    """The fleet as the database knows it, read at scrape time: devices by class and scheduler,
    recommendations and rollouts by status, each active rollout's devices by status, canary
    verdicts and policy changes (counted from what is stored, so they survive restarts)."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self.engine is None:
            return
        from sqlalchemy.orm import Session

        from service.ops import repository

        with Session(self.engine) as session:
            devices = GaugeMetricFamily(
                "blkpilot_fleet_devices",
                "Devices present, by class and current scheduler.",
                labels=["class", "scheduler"],
            )
            for device_class, scheduler, count in repository.devices_by_class_and_scheduler(
                session
            ):
                devices.add_metric([device_class, scheduler], count)
            yield devices

            recommendations = GaugeMetricFamily(
                "blkpilot_recommendations", "Recommendations by status.", labels=["status"]
            )
            for status, count in repository.recommendations_by_status(session):
                recommendations.add_metric([status], count)
            yield recommendations

            rollouts = GaugeMetricFamily(
                "blkpilot_rollouts", "Rollouts by status.", labels=["status"]
            )
            for status, count in repository.rollouts_by_status(session):
                rollouts.add_metric([status], count)
            yield rollouts

            progress = GaugeMetricFamily(
                "blkpilot_rollout_devices",
                "Devices of unfinished rollouts by their status (pending, passed, failed …).",
                labels=["rollout", "status"],
            )
            stage = GaugeMetricFamily(
                "blkpilot_rollout_stage",
                "Unfinished rollouts' current stage (1-based).",
                labels=["rollout"],
            )
            for name, status, count in repository.active_rollout_targets(session):
                progress.add_metric([name, status], count)
            for name, index in repository.active_rollout_stages(session):
                stage.add_metric([name], index + 1)
            yield progress
            yield stage

            verdicts = CounterMetricFamily(
                "blkpilot_canary_verdicts",
                "Canary results recorded, by verdict.",
                labels=["verdict"],
            )
            for verdict, count in repository.canary_verdicts(session):
                verdicts.add_metric([verdict or "none"], count)
            yield verdicts

            changes = CounterMetricFamily(
                "blkpilot_policy_changes",
                "Policies set or cleared (from the audit log).",
                labels=["action"],
            )
            for action, count in repository.policy_changes(session):
                changes.add_metric([action], count)
            yield changes


FLEET = FleetCollector()
REGISTRY.register(FLEET)
