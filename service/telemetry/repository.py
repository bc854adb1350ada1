"""Telemetry's SQL: batches, raw windows (COPY into day partitions), hourly rollups and the
partitions' upkeep."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from operator import itemgetter
from typing import Any

import msgspec
import psycopg
from sqlalchemy import delete, func, select, table, text, update
from sqlalchemy import types as sa_types
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from service.errors import Conflict
from service.tables import (
    TELEMETRY_WINDOWS_SET_ASIDE,
    TelemetryBatchRow,
    TelemetryHourlyRow,
    TelemetryRollupFailure,
    TelemetryWindowRow,
)

RAW = TelemetryWindowRow.__tablename__
HOURLY = TelemetryHourlyRow.__tablename__
SET_ASIDE = TELEMETRY_WINDOWS_SET_ASIDE.name
# what COPY writes, in order; JSONB columns are wrapped for psycopg
COPY_COLUMNS = tuple(c.name for c in TelemetryWindowRow.__table__.columns)
_VALUES = itemgetter(*COPY_COLUMNS)
# one advisory lock for partition DDL (any process, any replica)
PARTITION_LOCK = 0x626C6B70  # "blkp"
_DAY_NAME = re.compile(rf"^{RAW}_p(\d{{8}})$")
_MONTH_NAME = re.compile(rf"^{HOURLY}_p(\d{{6}})$")


def claim_batch(
    session: Session, batch_id: uuid.UUID, node_id: uuid.UUID, windows: int, digest: str
) -> bool:
    """Record the batch id; False if it was recorded before (by this transaction or another).

    A concurrent insert of the same id waits on the primary key until the other commits.
    """
    # on the session's own connection and transaction, as the COPY after it (psycopg
    # prepares it after its fifth use): the ORM's insert was 8 % of serve's Python time a push
    with _driver(session).cursor() as cursor:
        cursor.execute(_CLAIM, (batch_id, node_id, windows, digest))
        return cursor.fetchone() is not None


_CLAIM = (
    "INSERT INTO telemetry_batches (batch_id, node_id, windows, digest)"
    " VALUES (%s, %s, %s, %s) ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id"
)
assert TelemetryBatchRow.__tablename__ == "telemetry_batches"  # the statement's table


def _driver(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under the session, in the session's transaction."""
    raw = session.connection().connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    return raw


def claimed_batch(session: Session, batch_id: uuid.UUID) -> tuple[uuid.UUID, str | None] | None:
    """Who sent a batch id before, and the digest of what it held."""
    row = session.execute(
        select(TelemetryBatchRow.node_id, TelemetryBatchRow.digest).where(
            TelemetryBatchRow.batch_id == batch_id
        )
    ).one_or_none()
    return (row.node_id, row.digest) if row is not None else None


def copy_windows(session: Session, rows: Iterable[dict[str, Any]]) -> int:
    """COPY the rows into the raw table inside the session's transaction (whole or not at all:
    an error aborts the transaction). Their days' partitions must exist (ensure_days)."""
    try:
        return copy_rows(_driver(session), rows)
    except psycopg.errors.UniqueViolation as error:
        raise Conflict(
            "a window for the same device and interval was ingested before in another batch"
        ) from error


def copy_text(rows: Iterable[dict[str, Any]]) -> tuple[bytes, int]:
    """The rows as COPY's text format, every column in COPY_COLUMNS' order, and how many.

    Formatted here in bulk, where psycopg's write_row formats value by value through its
    adapters (7 µs a window, a fifth of serve's CPU in bench.ingest): one expression per row
    made from the columns' types (_line_format) — a float as repr (it reads back as the same
    double), an integer as str, text escaped as COPY reads it (backslash, tab, newline,
    carriage return), JSON as msgspec's, None as \\N — and the values a batch repeats (its
    id, each device's id, the windows' bounds, shared by its devices) formatted once."""
    memo = _Memo()
    line = _LINE
    lines = [line(_VALUES(row), memo) for row in rows]
    lines.append("")
    return "\n".join(lines).encode(), len(lines) - 1


def copy_rows(connection: psycopg.Connection[Any], rows: Iterable[dict[str, Any]]) -> int:
    """COPY on a psycopg connection, in its transaction; returns the rows written."""
    data, count = copy_text(rows)
    statement = f"COPY {RAW} ({', '.join(COPY_COLUMNS)}) FROM STDIN"
    with connection.cursor() as cursor, cursor.copy(statement) as copy:
        copy.write(data)
    return count


_COPY_ESCAPES = re.compile(r"[\\\t\n\r]")
_ESCAPED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _copy_str(value: str) -> str:
    if _COPY_ESCAPES.search(value) is None:
        return value
    return _COPY_ESCAPES.sub(lambda m: _ESCAPED[m.group()], value)


def _copy_json(value: Any) -> str:
    return _copy_str(msgspec.json.encode(value).decode())


class _Memo(dict[Any, str]):
    """UUIDs and timestamps as COPY text, each formatted once (str of a UUID and isoformat
    cost 0.5-0.8 µs a value)."""

    def __missing__(self, value: Any) -> str:
        if isinstance(value, datetime):
            if value.tzinfo is None:
                raise ValueError("a naive timestamp: the raw table stores instants")
            text = value.isoformat()
        elif isinstance(value, uuid.UUID):
            text = str(value)
        else:
            raise TypeError(f"no COPY text kept for {type(value).__name__}")
        self[value] = text
        return text


def _line_format(columns: Sequence[Any]) -> Callable[[tuple[Any, ...], _Memo], str]:
    """A function of (values, memo) to one COPY line: an f-string per column type, compiled
    once (a call per value cost more than the formatting)."""
    parts = []
    for index, column in enumerate(columns):
        kind, value = column.type, f"v[{index}]"
        if isinstance(kind, sa_types.Uuid | sa_types.DateTime):
            text = f"m[{value}]"
        elif isinstance(kind, sa_types.BigInteger):
            text = f"str({value})"
        elif isinstance(kind, sa_types.Float):
            text = f"repr({value})"
        elif isinstance(kind, JSONB):
            text = f"json({value})"
        elif isinstance(kind, sa_types.String):
            text = f"escape({value})"
        else:
            raise TypeError(f"{column.name}: no COPY text for {kind!r}")
        if column.nullable:
            text = f"(NULL if {value} is None else {text})"
        parts.append("{" + text + "}")
    source = 'lambda v, m: f"' + "\\t".join(parts) + '"'
    names = {"NULL": "\\N", "json": _copy_json, "escape": _copy_str}
    made: Callable[[tuple[Any, ...], _Memo], str] = eval(source, names)  # noqa: S307
    return made


_LINE = _line_format(list(TelemetryWindowRow.__table__.columns))


# --- partitions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    table: str
    low: datetime
    high: datetime


def day_partition(day: date) -> Partition:
    low = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return Partition(f"{RAW}_p{day:%Y%m%d}", low, low + timedelta(days=1))


def month_partition(day: date) -> Partition:
    low = datetime(day.year, day.month, 1, tzinfo=UTC)
    high = datetime(day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=UTC)
    return Partition(f"{HOURLY}_p{day:%Y%m}", low, high)


def partitions(connection: Connection | Session, parent: str) -> list[Partition]:
    """The parent's partitions that the service manages (by name), oldest first."""
    names = connection.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = CAST(:parent AS regclass)"
        ),
        {"parent": parent},
    ).scalars()
    found = []
    for name in names:
        if parent == RAW and (m := _DAY_NAME.match(name)):
            found.append(day_partition(datetime.strptime(m[1], "%Y%m%d").date()))
        elif parent == HOURLY and (m := _MONTH_NAME.match(name)):
            found.append(month_partition(datetime.strptime(m[1] + "01", "%Y%m%d").date()))
    return sorted(found, key=lambda p: p.low)


def create_partitions(
    connection: Connection, parent: str, wanted: Iterable[Partition]
) -> list[str]:
    """Create the partitions that do not exist yet, under the advisory lock (two processes
    creating the same one would race in the catalog). Returns the names created."""
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PARTITION_LOCK})
    have = {p.table for p in partitions(connection, parent)}
    created = []
    for partition in wanted:
        if partition.table in have:
            continue
        connection.execute(
            text(
                f"CREATE TABLE {partition.table} PARTITION OF {parent}"
                f" FOR VALUES FROM ('{partition.low.isoformat()}')"
                f" TO ('{partition.high.isoformat()}')"
            )
        )
        created.append(partition.table)
    return created


def stored_size(connection: Connection, parent: str) -> tuple[int, int]:
    """(bytes on disk with indexes, rows) of a partitioned table's partitions."""
    size = connection.execute(
        text(
            "SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)"
            " FROM pg_inherits i WHERE i.inhparent = CAST(:parent AS regclass)"
        ),
        {"parent": parent},
    ).scalar()
    rows = connection.execute(select(func.count()).select_from(table(parent))).scalar()
    return int(size or 0), int(rows or 0)


def database_size(connection: Connection) -> int:
    return int(
        connection.execute(text("SELECT pg_database_size(current_database())")).scalar() or 0
    )


def drop_partition(connection: Connection, partition: Partition) -> None:
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PARTITION_LOCK})
    connection.execute(text(f"DROP TABLE IF EXISTS {partition.table}"))


def try_maintenance_lock(connection: Connection, key: int) -> bool:
    """A session-level advisory lock: True if this connection now holds it."""
    return bool(
        connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar()
    )


def release_maintenance_lock(connection: Connection, key: int) -> None:
    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})


def forget_batches(connection: Connection, before: datetime) -> int:
    """Batch ids received before then: their windows are past retention, and so is a resend."""
    result = connection.execute(
        delete(TelemetryBatchRow).where(TelemetryBatchRow.received_at < before)
    )
    return int(result.rowcount or 0)


# --- hourly rollups ---------------------------------------------------------------------------

# (table names here and below are this module's constants; values are bound parameters)
_ROLL_UP = f"""
INSERT INTO {HOURLY} (device_id, hour, windows, seconds, read_ios, write_ios, read_bytes,
    write_bytes, queue_depth_seconds, busy_seconds, latency_us_ios, energy_joules, max_p99_us,
    operations, rolled_up_at)
SELECT w.device_id, date_trunc('hour', w.window_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
    count(*), sum(extract(epoch FROM w.window_end - w.window_start)),
    sum(w.read_ios), sum(w.write_ios), sum(w.read_bytes), sum(w.write_bytes),
    sum(w.queue_depth * extract(epoch FROM w.window_end - w.window_start)),
    sum(w.utilisation * extract(epoch FROM w.window_end - w.window_start)),
    sum(w.mean_latency_us * (w.read_ios::float8 + w.write_ios::float8)),
    sum(w.energy_joules), max(w.p99_us), NULL, now()
FROM {RAW} w
WHERE w.window_start >= :low AND w.window_start < :high
  AND EXISTS (SELECT 1 FROM devices d WHERE d.id = w.device_id)
GROUP BY 1, 2
ON CONFLICT (device_id, hour) DO UPDATE SET
    windows = EXCLUDED.windows, seconds = EXCLUDED.seconds, read_ios = EXCLUDED.read_ios,
    write_ios = EXCLUDED.write_ios, read_bytes = EXCLUDED.read_bytes,
    write_bytes = EXCLUDED.write_bytes, queue_depth_seconds = EXCLUDED.queue_depth_seconds,
    busy_seconds = EXCLUDED.busy_seconds, latency_us_ios = EXCLUDED.latency_us_ios,
    energy_joules = EXCLUDED.energy_joules, max_p99_us = EXCLUDED.max_p99_us,
    operations = NULL, rolled_up_at = now()
"""  # noqa: S608

# the hour's eBPF histograms, merged slot by slot per operation and kind
_MERGE_HISTOGRAMS = f"""
WITH slots AS (
    SELECT w.device_id,
        date_trunc('hour', w.window_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
        o ->> 'op' AS op, k.kind, (p ->> 0)::int AS slot, sum((p ->> 1)::bigint) AS n
    FROM {RAW} w
    CROSS JOIN LATERAL jsonb_array_elements(w.operations) AS o
    CROSS JOIN LATERAL (VALUES ('device_ns'), ('queue_ns'), ('size_bytes')) AS k(kind)
    CROSS JOIN LATERAL jsonb_array_elements(coalesce(o -> k.kind, '[]'::jsonb)) AS p
    WHERE w.operations IS NOT NULL AND w.window_start >= :low AND w.window_start < :high
    GROUP BY 1, 2, 3, 4, 5
), kinds AS (
    SELECT device_id, hour, op, kind,
        jsonb_agg(jsonb_build_array(slot, n) ORDER BY slot) AS histogram,
        sum(n) AS total
    FROM slots GROUP BY 1, 2, 3, 4
), ops AS (
    SELECT device_id, hour, op,
        jsonb_build_object('op', op,
            'count', max(total) FILTER (WHERE kind = 'device_ns'),
            'device_ns', coalesce(jsonb_object_agg(kind, histogram) -> 'device_ns', '[]'),
            'queue_ns', coalesce(jsonb_object_agg(kind, histogram) -> 'queue_ns', '[]'),
            'size_bytes', coalesce(jsonb_object_agg(kind, histogram) -> 'size_bytes', '[]'))
            AS operation
    FROM kinds GROUP BY 1, 2, 3
), merged AS (
    SELECT device_id, hour, jsonb_agg(operation ORDER BY op) AS operations
    FROM ops GROUP BY 1, 2
)
UPDATE {HOURLY} h SET operations = merged.operations
FROM merged WHERE h.device_id = merged.device_id AND h.hour = merged.hour
"""  # noqa: S608


def roll_up(connection: Connection, low: datetime, high: datetime) -> int:
    """(Re)compute the hourly rows of every hour in [low, high) from the raw windows there.
    Returns the number of device-hours written."""
    bounds = {"low": low, "high": high}
    written = connection.execute(text(_ROLL_UP), bounds).rowcount
    connection.execute(text(_MERGE_HISTOGRAMS), bounds)
    return int(written or 0)


def last_rolled_hour(connection: Connection) -> datetime | None:
    """The latest hour rolled up — or set aside as failed, which the upkeep moves past too."""
    return connection.execute(
        select(
            func.greatest(
                select(func.max(TelemetryHourlyRow.hour)).scalar_subquery(),
                select(func.max(TelemetryRollupFailure.hour)).scalar_subquery(),
            )
        )
    ).scalar()


def record_rollup_failure(connection: Connection, hour: datetime, error: str) -> None:
    failure = TelemetryRollupFailure
    statement = pg_insert(failure).values(hour=hour, error=error[:2000])
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=[failure.hour],
            set_={
                "error": statement.excluded.error,
                "attempts": failure.attempts + 1,
                "last_failed_at": func.now(),
            },
        )
    )


def clear_rollup_failure(connection: Connection, hour: datetime) -> None:
    connection.execute(delete(TelemetryRollupFailure).where(TelemetryRollupFailure.hour == hour))


def set_aside_hour(connection: Connection, hour: datetime) -> int:
    """Move an hour's raw windows to telemetry_windows_set_aside; returns how many."""
    moved = connection.execute(
        text(
            f"INSERT INTO {SET_ASIDE} SELECT * FROM {RAW}"  # noqa: S608
            " WHERE window_start >= :low AND window_start < :high ON CONFLICT DO NOTHING"
        ),
        {"low": hour, "high": hour + timedelta(hours=1)},
    ).rowcount
    connection.execute(
        update(TelemetryRollupFailure)
        .where(TelemetryRollupFailure.hour == hour)
        .values(windows_set_aside=TelemetryRollupFailure.windows_set_aside + (moved or 0))
    )
    return int(moved or 0)


def rollup_failures(session: Session) -> Sequence[TelemetryRollupFailure]:
    return session.scalars(
        select(TelemetryRollupFailure).order_by(TelemetryRollupFailure.hour)
    ).all()


def hourly_for_device(
    session: Session, device_id: uuid.UUID, *, since: datetime, until: datetime | None = None
) -> Sequence[TelemetryHourlyRow]:
    query = (
        select(TelemetryHourlyRow)
        .where(TelemetryHourlyRow.device_id == device_id, TelemetryHourlyRow.hour >= since)
        .order_by(TelemetryHourlyRow.hour)
    )
    if until is not None:
        query = query.where(TelemetryHourlyRow.hour < until)
    return session.scalars(query).all()


def hour_as_window(hour: TelemetryHourlyRow) -> dict[str, Any]:
    """An hourly row in the shape workload mapping reads from a window (models.mapping): the
    hour's rates and means, and its merged histograms."""
    ios = hour.read_ios + hour.write_ios
    seconds = hour.seconds or 1.0
    return {
        "iops": ios / seconds,
        "read_ios": hour.read_ios,
        "write_ios": hour.write_ios,
        "read_share": hour.read_ios / ios if ios else 0.0,
        "mean_request_bytes": (hour.read_bytes + hour.write_bytes) / ios if ios else 0.0,
        "queue_depth": hour.queue_depth_seconds / seconds,
        "operations": hour.operations,
    }


def raw_horizon(session: Session) -> datetime | None:
    """Where raw windows begin: the oldest day partition's start (None: no partition)."""
    found = partitions(session, RAW)
    return found[0].low if found else None


def windows_for_device(
    session: Session,
    device_id: uuid.UUID,
    *,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> Sequence[TelemetryWindowRow]:
    query = (
        select(TelemetryWindowRow)
        .where(TelemetryWindowRow.device_id == device_id)
        .order_by(TelemetryWindowRow.window_start.desc())
        .limit(limit)
    )
    if since is not None:
        query = query.where(TelemetryWindowRow.window_start >= since)
    if until is not None:
        query = query.where(TelemetryWindowRow.window_end <= until)
    return session.scalars(query).all()


def busy_mean_latency(
    session: Session,
    device_id: uuid.UUID,
    *,
    starting_from: datetime,
    ending_by: datetime | None = None,
) -> tuple[float | None, int]:
    """The mean of a device's busy windows' mean latency (µs) in a span, and how many windows."""
    query = select(func.avg(TelemetryWindowRow.mean_latency_us), func.count()).where(
        TelemetryWindowRow.device_id == device_id,
        TelemetryWindowRow.window_start >= starting_from,
        TelemetryWindowRow.iops > 0,
    )
    if ending_by is not None:
        query = query.where(TelemetryWindowRow.window_end <= ending_by)
    mean, count = session.execute(query).one()
    return (float(mean) if mean is not None else None), int(count)
