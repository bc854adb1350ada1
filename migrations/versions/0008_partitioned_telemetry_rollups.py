"""telemetry that stays bounded: raw windows partitioned by day, hourly rollups by month

Raw windows move into a table partitioned by range of window_start, one partition per UTC day;
the service creates partitions ahead and drops them past the raw retention
(service/telemetry/retention.py), after rolling them up into telemetry_hourly (one row per
device and hour: counts, sums, merged latency and size histograms), partitioned by month and
kept much longer.

The raw table has no surrogate id (its key is the device and interval, which was unique
before) and no foreign keys: a foreign key on a partitioned table is a per-row trigger on
every COPYed window, and a device's raw windows leave by retention, not by cascade. The rows
there are copied over; every day they cover gets its partition.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSONB = postgresql.JSONB(astext_type=sa.Text())
RAW = "telemetry_windows"
HOURLY = "telemetry_hourly"
OLD = "telemetry_windows_unpartitioned"
AHEAD_DAYS = 3  # the service keeps this many days ready too; it names partitions the same way


def _columns() -> list[sa.Column]:  # type: ignore[type-arg]
    return [
        sa.Column("device_id", sa.UUID(), nullable=False),
        sa.Column("batch_id", sa.UUID(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("read_ios", sa.BigInteger(), nullable=False),
        sa.Column("write_ios", sa.BigInteger(), nullable=False),
        sa.Column("read_bytes", sa.BigInteger(), nullable=False),
        sa.Column("write_bytes", sa.BigInteger(), nullable=False),
        sa.Column("iops", sa.Double(), nullable=False),
        sa.Column("read_share", sa.Double(), nullable=False),
        sa.Column("mean_request_bytes", sa.Double(), nullable=False),
        sa.Column("mean_latency_us", sa.Double(), nullable=False),
        sa.Column("queue_depth", sa.Double(), nullable=False),
        sa.Column("utilisation", sa.Double(), nullable=False),
        sa.Column("power_watts", sa.Double(), nullable=True),
        sa.Column("energy_joules", sa.Double(), nullable=True),
        sa.Column("power_scope", sa.String(16), nullable=True),
        sa.Column("cpu_utilisation", sa.Double(), nullable=True),
        sa.Column("context_switches_per_s", sa.Double(), nullable=True),
        sa.Column("power_source", sa.String(16), nullable=True),
        sa.Column("power_readings", JSONB, nullable=True),
        sa.Column("latency_source", sa.String(16), nullable=False, server_default="diskstats"),
        sa.Column("latency_note", sa.Text(), nullable=False, server_default=""),
        sa.Column("operations", JSONB, nullable=True),
        sa.Column("p50_us", sa.Double(), nullable=True),
        sa.Column("p99_us", sa.Double(), nullable=True),
        sa.Column("p999_us", sa.Double(), nullable=True),
    ]


COPIED = ", ".join(c.name for c in _columns())


def _bound(when: datetime) -> str:
    return f"'{when.isoformat()}'"


def _day(parent: str, day: date) -> None:
    low = datetime(day.year, day.month, day.day, tzinfo=UTC)
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {parent}_p{day:%Y%m%d} PARTITION OF {parent}"
        f" FOR VALUES FROM ({_bound(low)}) TO ({_bound(low + timedelta(days=1))})"
    )


def _month(parent: str, first: date) -> None:
    low = datetime(first.year, first.month, 1, tzinfo=UTC)
    high = datetime(first.year + first.month // 12, first.month % 12 + 1, 1, tzinfo=UTC)
    op.execute(
        f"CREATE TABLE IF NOT EXISTS {parent}_p{first:%Y%m} PARTITION OF {parent}"
        f" FOR VALUES FROM ({_bound(low)}) TO ({_bound(high)})"
    )


def upgrade() -> None:
    op.execute(f"ALTER TABLE {RAW} RENAME TO {OLD}")
    for old in ("pk_telemetry_windows", "uq_telemetry_windows_device_id"):
        op.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT {old} TO {old}_old")
    for old in ("ix_telemetry_windows_batch_id", "ix_telemetry_windows_device_start"):
        op.execute(f"ALTER INDEX {old} RENAME TO {old}_old")
    op.create_table(
        RAW,
        *_columns(),
        sa.PrimaryKeyConstraint(
            "device_id", "window_start", "window_end", name=op.f("pk_telemetry_windows")
        ),
        postgresql_partition_by="RANGE (window_start)",
    )
    # the rollup's hour ranges; BRIN since windows arrive in about time order (tiny, and cheap
    # to keep up while COPY streams rows in). Per-device reads use the primary key.
    op.create_index("ix_telemetry_windows_start", RAW, ["window_start"], postgresql_using="brin")

    today = datetime.now(UTC).date()
    bind = op.get_bind()
    days = {
        row[0]
        for row in bind.execute(
            sa.text(
                f"SELECT DISTINCT (window_start AT TIME ZONE 'UTC')::date FROM {OLD}"  # noqa: S608
                " WHERE window_start >= '0001-01-02' AND window_start < '9999-12-31'"
            )
        )
    }
    # (stored before the service refused implausible dates; a partition can hold them too)
    days |= {today + timedelta(days=n) for n in range(AHEAD_DAYS + 1)}
    for day in sorted(days):
        _day(RAW, day)
    # rows dated at the very ends of the calendar (stored before the service refused them):
    # kept, out of every day's way; never rolled up, never dropped by retention
    op.execute(f"CREATE TABLE {RAW}_outliers PARTITION OF {RAW} DEFAULT")
    op.execute(f"INSERT INTO {RAW} ({COPIED}) SELECT {COPIED} FROM {OLD}")  # noqa: S608
    op.drop_table(OLD)

    op.create_table(
        HOURLY,
        sa.Column("device_id", sa.UUID(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("windows", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Double(), nullable=False),
        sa.Column("read_ios", sa.BigInteger(), nullable=False),
        sa.Column("write_ios", sa.BigInteger(), nullable=False),
        sa.Column("read_bytes", sa.BigInteger(), nullable=False),
        sa.Column("write_bytes", sa.BigInteger(), nullable=False),
        # time-weighted sums: divide by seconds for the hour's mean
        sa.Column("queue_depth_seconds", sa.Double(), nullable=False),
        sa.Column("busy_seconds", sa.Double(), nullable=False),
        # I/O-weighted: divide by read_ios + write_ios for the hour's mean latency
        sa.Column("latency_us_ios", sa.Double(), nullable=False),
        sa.Column("energy_joules", sa.Double(), nullable=True),
        sa.Column("max_p99_us", sa.Double(), nullable=True),
        # per operation: count and the merged device time, queue time and size histograms
        sa.Column("operations", JSONB, nullable=True),
        sa.Column(
            "rolled_up_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
            name=op.f("fk_telemetry_hourly_device_id_devices"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("device_id", "hour", name=op.f("pk_telemetry_hourly")),
        postgresql_partition_by="RANGE (hour)",
    )
    op.create_index("ix_telemetry_hourly_hour", HOURLY, ["hour"])
    months = {date(d.year, d.month, 1) for d in days}
    for month in sorted(months):
        _month(HOURLY, month)


def downgrade() -> None:
    op.drop_table(HOURLY)
    op.execute(f"ALTER TABLE {RAW} RENAME TO {OLD}")
    op.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT pk_telemetry_windows TO pk_{OLD}")
    op.execute(f"ALTER INDEX ix_telemetry_windows_start RENAME TO ix_{OLD}_start")
    op.create_table(
        RAW,
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        *_columns(),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["telemetry_batches.batch_id"],
            name=op.f("fk_telemetry_windows_batch_id_telemetry_batches"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
            name=op.f("fk_telemetry_windows_device_id_devices"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_telemetry_windows")),
        sa.UniqueConstraint(
            "device_id", "window_start", "window_end", name=op.f("uq_telemetry_windows_device_id")
        ),
    )
    op.create_index(op.f("ix_telemetry_windows_batch_id"), RAW, ["batch_id"])
    op.create_index("ix_telemetry_windows_device_start", RAW, ["device_id", "window_start"])
    # windows whose device or batch is gone (retention and deletions left them) stay behind
    op.execute(
        f"INSERT INTO {RAW} ({COPIED}) SELECT {COPIED} FROM {OLD} w"  # noqa: S608
        " WHERE EXISTS (SELECT 1 FROM devices d WHERE d.id = w.device_id)"
        " AND EXISTS (SELECT 1 FROM telemetry_batches b WHERE b.batch_id = w.batch_id)"
        " ORDER BY window_start"
    )
    op.drop_table(OLD)
