"""The schema, as SQLAlchemy 2 typed tables. It changes only through Alembic migrations."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSON, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

OBJECTIVE_LENGTH = 64  # an objective's name, or a mix's label (energy_estimated filled 16)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSONB, uuid.UUID: UUID(as_uuid=True)}


def _now() -> Any:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class ApiToken(Base):
    """An operator's token. Only its SHA-256 is stored."""

    __tablename__ = "api_tokens"
    __table_args__ = (CheckConstraint("role IN ('viewer', 'operator', 'admin')", name="role"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = _now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # None: never
    # when it was last accepted, to the minute (written at most once a minute per token)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class EnrollmentToken(Base):
    """A one-time secret a new node trades for its own node token."""

    __tablename__ = "enrollment_tokens"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    used_by_node_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("nodes.id"))


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    hostname: Mapped[str] = mapped_column(String(253), index=True)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    token_expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # the token the last rotation replaced: still accepted until its grace period ends, so an
    # agent whose renewal answer was lost is not locked out
    previous_token_sha256: Mapped[str | None] = mapped_column(String(64), unique=True)
    previous_token_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # a revoked node's tokens are refused at once; its devices and history stay
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    agent_version: Mapped[str] = mapped_column(String(255), default="")
    kernel_version: Mapped[str] = mapped_column(String(255), default="")
    enrolled_at: Mapped[datetime] = _now()
    last_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Device(Base):
    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("node_id", "name"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(255), default="")
    serial: Mapped[str] = mapped_column(String(255), default="")
    wwid: Mapped[str] = mapped_column(String(255), default="")
    transport: Mapped[str] = mapped_column(String(16))
    device_class: Mapped[str] = mapped_column(String(16), index=True)
    class_evidence: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    rotational: Mapped[bool] = mapped_column(Boolean)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    holds_data: Mapped[bool] = mapped_column(Boolean)
    holds_data_reasons: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    available_schedulers: Mapped[list[str]] = mapped_column(ARRAY(String(16)), default=list)
    current_scheduler: Mapped[str | None] = mapped_column(String(16))
    capabilities: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # what else sets its queue attributes (agent.owners), as its agent last reported
    owners: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list, server_default="[]")
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    first_seen_at: Mapped[datetime] = _now()
    last_seen_at: Mapped[datetime] = _now()


class TelemetryBatchRow(Base):
    """One row per ingested batch id: what makes ingest idempotent."""

    __tablename__ = "telemetry_batches"

    batch_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    windows: Mapped[int] = mapped_column(Integer)
    # SHA-256 of the batch's content: a resend with the same id must be the same batch
    # (NULL: received before 0011, taken on trust)
    digest: Mapped[str | None] = mapped_column(String(64))
    received_at: Mapped[datetime] = _now()


class TelemetryWindowRow(Base):
    """A raw window. Partitioned by day of window_start (migration 0008): the service creates
    partitions ahead and drops them past the raw retention (service/telemetry/retention.py).
    No foreign keys: each would be a trigger on every COPYed row."""

    __tablename__ = "telemetry_windows"
    __table_args__ = (
        # BRIN: windows arrive in about time order; the rollup's hour ranges read through it
        Index("ix_telemetry_windows_start", "window_start", postgresql_using="brin"),
        {"postgresql_partition_by": "RANGE (window_start)"},
    )

    device_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    batch_id: Mapped[uuid.UUID]
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    window_end: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    read_ios: Mapped[int] = mapped_column(BigInteger)
    write_ios: Mapped[int] = mapped_column(BigInteger)
    read_bytes: Mapped[int] = mapped_column(BigInteger)
    write_bytes: Mapped[int] = mapped_column(BigInteger)
    iops: Mapped[float] = mapped_column(Double)
    read_share: Mapped[float] = mapped_column(Double)
    mean_request_bytes: Mapped[float] = mapped_column(Double)
    mean_latency_us: Mapped[float] = mapped_column(Double)
    queue_depth: Mapped[float] = mapped_column(Double)
    utilisation: Mapped[float] = mapped_column(Double)
    cpu_utilisation: Mapped[float | None] = mapped_column(Double)
    context_switches_per_s: Mapped[float | None] = mapped_column(Double)
    power_watts: Mapped[float | None] = mapped_column(Double)
    energy_joules: Mapped[float | None] = mapped_column(Double)
    power_scope: Mapped[str | None] = mapped_column(String(16))
    power_source: Mapped[str | None] = mapped_column(String(16))
    power_readings: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    latency_source: Mapped[str] = mapped_column(String(16), server_default="diskstats")
    latency_note: Mapped[str] = mapped_column(Text, server_default="")
    # json, not jsonb (migration 0015): stored as sent, and read once, by the hourly roll-up
    # (service.telemetry.hourly) — jsonb made PostgreSQL turn an eBPF window's ~9,000 numbers
    # into numerics on every insert
    operations: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    p50_us: Mapped[float | None] = mapped_column(Double)
    p99_us: Mapped[float | None] = mapped_column(Double)
    p999_us: Mapped[float | None] = mapped_column(Double)


class TelemetryHourlyRow(Base):
    """One device's hour of telemetry, rolled up from its raw windows before they are dropped:
    counts, sums and merged histograms, from which the hour's rates and means follow.
    Partitioned by month of hour; kept past raw retention (default 400 days)."""

    __tablename__ = "telemetry_hourly"
    __table_args__ = (
        Index("ix_telemetry_hourly_hour", "hour"),
        {"postgresql_partition_by": "RANGE (hour)"},
    )

    device_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("devices.id", ondelete="CASCADE"), primary_key=True
    )
    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    windows: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Double)
    read_ios: Mapped[int] = mapped_column(BigInteger)
    write_ios: Mapped[int] = mapped_column(BigInteger)
    read_bytes: Mapped[int] = mapped_column(BigInteger)
    write_bytes: Mapped[int] = mapped_column(BigInteger)
    queue_depth_seconds: Mapped[float] = mapped_column(Double)  # / seconds: the mean
    busy_seconds: Mapped[float] = mapped_column(Double)
    latency_us_ios: Mapped[float] = mapped_column(Double)  # / (read_ios + write_ios): the mean
    energy_joules: Mapped[float | None] = mapped_column(Double)
    max_p99_us: Mapped[float | None] = mapped_column(Double)
    # [{op, count, device_ns, queue_ns, size_bytes}]: the hour's merged histograms
    operations: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    rolled_up_at: Mapped[datetime] = _now()


class TelemetryRollupFailure(Base):
    """An hour the upkeep could not roll up (a row whose sums do not fit, a histogram that does
    not parse). The upkeep moves on past it; when its day is dropped the hour is tried once
    more, and the windows that still fail are moved to telemetry_windows_set_aside."""

    __tablename__ = "telemetry_rollup_failures"

    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    error: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, server_default="1")
    first_failed_at: Mapped[datetime] = _now()
    last_failed_at: Mapped[datetime] = _now()
    windows_set_aside: Mapped[int] = mapped_column(Integer, server_default="0")


# the raw windows of an hour that failed its last roll-up: kept, out of the partitions' way,
# for an operator to read (same columns and key as telemetry_windows, not partitioned)
TELEMETRY_WINDOWS_SET_ASIDE = Table(
    "telemetry_windows_set_aside",
    Base.metadata,
    *(column._copy() for column in TelemetryWindowRow.__table__.columns),
)


class Observation(Base):
    """A benchmark or canary result: device, workload, configuration, metrics."""

    __tablename__ = "observations"
    __table_args__ = (Index("ix_observations_device_finished", "device_id", "finished_at"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    device_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    tool: Mapped[str] = mapped_column(String(16))
    workload_name: Mapped[str] = mapped_column(String(128), index=True)
    workload: Mapped[dict[str, Any]] = mapped_column()
    configuration: Mapped[dict[str, Any]] = mapped_column()
    metrics: Mapped[dict[str, Any]] = mapped_column()
    statistics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    verdict: Mapped[str | None] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    recorded_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = _now()


class Policy(Base):
    """The desired configuration of one device, and what its agent last reported applying."""

    __tablename__ = "policies"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    device_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("devices.id", ondelete="CASCADE"), unique=True
    )
    config: Mapped[dict[str, Any]] = mapped_column()
    version: Mapped[int] = mapped_column(Integer)
    set_by: Mapped[str] = mapped_column(String(160))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    applied_version: Mapped[int | None] = mapped_column(Integer)
    applied_status: Mapped[str | None] = mapped_column(String(16))
    applied_config: Mapped[dict[str, Any] | None] = mapped_column()
    applied_detail: Mapped[str | None] = mapped_column(Text)
    applied_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # a policy that only puts the device back as it was before blkpilot changed it: cleared
    # once its agent reports it applied, so the device is unmanaged again (an undo)
    release_when_applied: Mapped[bool] = mapped_column(default=False, server_default="false")
    # where another owner sets what this policy sets: take_over or yield (OwnerPolicy)
    owners: Mapped[str] = mapped_column(String(16), default="take_over", server_default="take_over")


# Present devices counted by class, current scheduler and completion mode, kept by triggers
# on devices and policies (migration 0009) as +1/-1 rows: the fleet page and the metrics sum
# them instead of scanning every device (130-180 ms idle at 160,000 devices). Append-only, so
# concurrent enrolments never wait on one counter row; the upkeep folds them back together.
DEVICE_COUNTS = Table(
    "device_counts",
    Base.metadata,
    Column("device_class", String(16), nullable=False),
    Column("scheduler", String(16), nullable=False),
    Column("completion", Text, nullable=False),
    Column("n", Integer, nullable=False),
)


class AuditEvent(Base):
    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_target", "target_type", "target_id", "at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = _now()
    actor: Mapped[str] = mapped_column(String(160))
    action: Mapped[str] = mapped_column(String(64), index=True)
    target_type: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str] = mapped_column(String(64))
    before: Mapped[dict[str, Any] | None] = mapped_column()
    after: Mapped[dict[str, Any] | None] = mapped_column()
    detail: Mapped[str] = mapped_column(Text, default="")


class ModelVersion(Base):
    """One trained model (a nightly task: a device class and an objective), with the range of
    the observations it learned from and how well it predicted cells it did not see."""

    __tablename__ = "model_versions"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    run_id: Mapped[uuid.UUID] = mapped_column(index=True)  # the nightly run that trained it
    device_class: Mapped[str] = mapped_column(String(16))
    objective: Mapped[str] = mapped_column(String(OBJECTIVE_LENGTH))
    rows: Mapped[int] = mapped_column(Integer)
    cells: Mapped[int] = mapped_column(Integer)
    data_from: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    data_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    scores: Mapped[dict[str, Any]] = mapped_column(default=dict)
    parameters: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = _now()


class RecommendationRow(Base):
    """What the search recommends for a device, against what it runs now — one row per
    configuration, for every objective it is best for (`objective` the lead one); an operator
    accepts it (it becomes the device's policy) or rejects it; a failed canary of it refutes
    it."""

    __tablename__ = "recommendations"
    __table_args__ = (
        CheckConstraint(
            "status IN ('proposed', 'accepted', 'verifying', 'kept', 'rolled_back', 'applied',"
            " 'reverted', 'rejected', 'superseded', 'refuted')",
            name="status",
        ),
        Index("ix_recommendations_device_status", "device_id", "status"),
        Index("ix_recommendations_rollout", "rollout_id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    device_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    model_version_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("model_versions.id", ondelete="CASCADE")
    )
    objective: Mapped[str] = mapped_column(String(OBJECTIVE_LENGTH))
    objectives: Mapped[list[str]] = mapped_column(ARRAY(Text))  # every one it is best for
    workload_name: Mapped[str] = mapped_column(String(128))
    workload_basis: Mapped[str] = mapped_column(Text)  # why this workload (telemetry match …)
    current_config: Mapped[dict[str, Any] | None] = mapped_column()
    recommended_config: Mapped[dict[str, Any]] = mapped_column()
    predictions: Mapped[dict[str, Any]] = mapped_column()  # objective -> current/recommended
    confidence: Mapped[float] = mapped_column(Double)
    evidence: Mapped[dict[str, Any]] = mapped_column()
    reason: Mapped[str] = mapped_column(Text)
    next_canary: Mapped[dict[str, Any] | None] = mapped_column()
    expected_gain: Mapped[float] = mapped_column(Double)
    status: Mapped[str] = mapped_column(String(16), default="proposed")
    decided_by: Mapped[str | None] = mapped_column(String(160))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    decision_reason: Mapped[str | None] = mapped_column(Text)
    # the latest canary of the recommended configuration on the device since it was made:
    # observation_id, verdict, finished_at, effects {metric: change, low, high, unit}; a fail
    # makes the status 'refuted'
    canary: Mapped[dict[str, Any] | None] = mapped_column()
    # accepting it starts a one-device rollout that tries it under a canary: verifying while
    # the rollout runs, then kept or rolled_back (service.recommendations.service)
    rollout_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("rollouts.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = _now()


class ScheduledCanary(Base):
    """A canary the nightly job wants run: the configuration most worth measuring on a device
    for a workload, ranked by expected gain (promise) and uncertainty."""

    __tablename__ = "scheduled_canaries"
    __table_args__ = (
        CheckConstraint("status IN ('scheduled', 'done', 'cancelled')", name="status"),
        Index("ix_scheduled_canaries_device_status", "device_id", "status"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    run_id: Mapped[uuid.UUID] = mapped_column(index=True)
    device_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    objective: Mapped[str] = mapped_column(String(OBJECTIVE_LENGTH))
    workload_name: Mapped[str] = mapped_column(String(128))
    workload: Mapped[dict[str, Any]] = mapped_column()
    config: Mapped[dict[str, Any]] = mapped_column()
    expected_gain: Mapped[float] = mapped_column(Double)
    uncertainty: Mapped[float] = mapped_column(Double)
    rank: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="scheduled")
    created_at: Mapped[datetime] = _now()


class NightlyRun(Base):
    """A nightly job an operator queued through the API: the service's nightly worker claims
    it, runs it and stores its report (or why it failed)."""

    __tablename__ = "nightly_runs"
    __table_args__ = (
        CheckConstraint("status IN ('queued', 'running', 'done', 'failed')", name="status"),
        Index("ix_nightly_runs_status_created", "status", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    options: Mapped[dict[str, Any]] = mapped_column()
    requested_by: Mapped[str] = mapped_column(String(128))
    report: Mapped[dict[str, Any] | None] = mapped_column()
    error: Mapped[str | None] = mapped_column(String(2000))
    created_at: Mapped[datetime] = _now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Rollout(Base):
    """A configuration rolled out to devices in stages, each gated by every node's canary and a
    soak without guardrail breaches. Its whole state is here, so a restarted service goes on
    where the last one stopped; a worker holds a lease on it while it acts."""

    __tablename__ = "rollouts"
    __table_args__ = (
        CheckConstraint(
            "status IN ('running', 'paused', 'rolling_back', 'succeeded', 'rolled_back', 'failed')",
            name="status",
        ),
        CheckConstraint("phase IN ('canary', 'soak')", name="phase"),
        Index("ix_rollouts_status", "status"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(128))
    config: Mapped[dict[str, Any]] = mapped_column()
    target: Mapped[dict[str, Any]] = mapped_column()  # the selector as asked
    workload_name: Mapped[str] = mapped_column(String(128))
    canary: Mapped[dict[str, Any]] = mapped_column()  # rounds, round_seconds, alpha
    stages: Mapped[list[int]] = mapped_column(ARRAY(Integer))  # cumulative node counts
    stage_specs: Mapped[list[str]] = mapped_column(ARRAY(String(16)))  # as asked: "1", "10%"
    serial: Mapped[str] = mapped_column(String(16))
    max_fail_percentage: Mapped[int] = mapped_column(Integer)
    soak_seconds: Mapped[float] = mapped_column(Double)
    guardrails: Mapped[dict[str, Any]] = mapped_column()
    status: Mapped[str] = mapped_column(String(16), default="running")
    stage: Mapped[int] = mapped_column(Integer, default=0)
    phase: Mapped[str] = mapped_column(String(16), default="canary")
    stage_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    soak_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str] = mapped_column(Text, default="")
    status_detail: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_owner: Mapped[str | None] = mapped_column(String(160))
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RolloutTarget(Base):
    """One device of a rollout: its stage, what happened to it, and the policy it had before."""

    __tablename__ = "rollout_targets"
    __table_args__ = (
        CheckConstraint(
            "status IN ('pending', 'changing', 'passed', 'failed', 'inconclusive',"
            " 'rolling_back', 'rolled_back', 'restore_failed')",
            name="status",
        ),
        UniqueConstraint("rollout_id", "device_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    rollout_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"))
    device_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"))
    node_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    hostname: Mapped[str] = mapped_column(String(253))
    device_name: Mapped[str] = mapped_column(String(64))
    stage: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    verdict: Mapped[str | None] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="")
    previous_policy: Mapped[dict[str, Any] | None] = mapped_column()  # config + version, or null
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = _now()
