"""Telemetry's SQL: batches, raw windows (COPY into day partitions), hourly rollups and the
partitions' upkeep."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from itertools import groupby
from typing import Any

import msgspec
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy import delete, func, select, table, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from agent.contract.base import MAX_DEPTH, MAX_JOULES, MAX_MICROS, MAX_WINDOW_SPAN
from service.errors import Conflict
from service.tables import (
    TELEMETRY_WINDOWS_SET_ASIDE,
    TelemetryBatchRow,
    TelemetryHourlyRow,
    TelemetryRollupFailure,
    TelemetryWindowRow,
)
from service.telemetry import columns, hourly

RAW = TelemetryWindowRow.__tablename__
HOURLY = TelemetryHourlyRow.__tablename__
SET_ASIDE = TELEMETRY_WINDOWS_SET_ASIDE.name
# a raw window's columns, in the table's order: every one is in each row ingest stores
WINDOW_COLUMNS = tuple(c.name for c in TelemetryWindowRow.__table__.columns)
# one advisory lock for partition DDL (any process, any replica)
PARTITION_LOCK = 0x626C6B70  # "blkp"
_DAY_NAME = re.compile(rf"^{RAW}_p(\d{{8}})$")
_MONTH_NAME = re.compile(rf"^{HOURLY}_p(\d{{6}})$")


@dataclass(frozen=True)
class EncodedWindows:
    """A batch's windows as store_batch's statement reads them: `arrays`, each raw-table
    column's values as a PostgreSQL binary array (service.telemetry.columns.encode), `count`
    windows, and the batch's `digest`, claimed with it."""

    digest: str
    arrays: dict[str, bytes]
    count: int
    low: datetime  # the batch's earliest window start
    high: datetime  # and latest window end


@dataclass(frozen=True)
class Overlap:
    """A window of a batch that overlaps another window of its device: one stored before
    (`in_batch` False) or one of the same batch."""

    device_id: uuid.UUID
    start: datetime
    end: datetime
    other_start: datetime
    other_end: datetime
    in_batch: bool


@dataclass(frozen=True)
class Stored:
    """What the storing statement did: `claimed` the batch id (and stored `windows`), or
    claimed nothing — the id was claimed before, or a window `overlaps` another."""

    claimed: bool
    windows: int
    overlaps: Overlap | None


def store_batch(
    session: Session, batch_id: uuid.UUID, node_id: uuid.UUID, encoded: EncodedWindows
) -> Stored:
    """Claim the batch id and store its windows, in one statement, unless a window overlaps
    another of its device (stored, or in the batch: nothing is claimed or stored, and the
    first such pair is returned). A concurrent claim of the same id waits on the primary key
    until the other commits; a window stored meanwhile by a concurrent batch aborts the
    statement, claim and all (Conflict). The statement reads the windows from one binary
    array per column, side by side (_STORE): no row is built in Python, and no JSON is
    parsed in PostgreSQL.

    When the session has used no connection yet (its node's devices and the windows' days
    known without a lookup: every push but the first of a day) the statement is committed on
    its own, so a push is one round trip where BEGIN, the claim, COPY's two and COMMIT were
    five: 2.2-2.8 → 1.65 ms of serve's CPU a 48-window push (bench/results/ingest.md)."""
    # not in a transaction the session joined (a test's, rolled back at its end)
    autocommit = isinstance(session.get_bind(), Engine) and not session.in_transaction()
    options = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    raw = session.connection(execution_options=options).connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    parameters = _parameters(batch_id, node_id, encoded)
    try:
        with raw.cursor() as cursor:
            cursor.execute(_STORE, parameters)
            return _stored(cursor.fetchone())
    except psycopg.errors.UniqueViolation as error:
        raise stored_before() from error


async def store_pushed_batch(
    connection: psycopg.AsyncConnection[Any],
    batch_id: uuid.UUID,
    node_id: uuid.UUID,
    encoded: EncodedWindows,
) -> Stored:
    """store_batch's statement on an autocommitting connection of the event loop's
    (service.db.push_connections): committed when it returns, or nothing stored."""
    parameters = _parameters(batch_id, node_id, encoded)
    try:
        cursor = await connection.execute(_STORE, parameters)
        return _stored(await cursor.fetchone())
    except psycopg.errors.UniqueViolation as error:
        raise stored_before() from error


def _stored(row: Any) -> Stored:
    claimed, windows, clash = row or (0, 0, None)
    overlap = None
    if clash is not None:
        device_id, start, end, other_start, other_end, in_batch = clash
        overlap = Overlap(
            uuid.UUID(device_id),
            datetime.fromisoformat(start),
            datetime.fromisoformat(end),
            datetime.fromisoformat(other_start),
            datetime.fromisoformat(other_end),
            bool(in_batch),
        )
    return Stored(bool(claimed), int(windows), overlap)


def _parameters(batch_id: uuid.UUID, node_id: uuid.UUID, encoded: EncodedWindows) -> dict[str, Any]:
    return {
        "batch_id": batch_id,
        "node_id": node_id,
        "count": encoded.count,
        "digest": encoded.digest,
        "span": MAX_WINDOW_SPAN,
        # the batch's span less a window's longest: the day partitions the overlap probe reads,
        # pruned once for the statement rather than looked up window by window
        "low": encoded.low - MAX_WINDOW_SPAN,
        "high": encoded.high,
        # each array sent as built, typed by its array type's oid (_ARRAY_TYPES)
        **{c.name: _ARRAY_TYPES[c.kind](encoded.arrays[c.name]) for c in columns.COLUMNS},
    }


def stored_before(window: str = "a window") -> Conflict:
    return Conflict(
        f"{window} for the same device and interval was ingested before in another batch;"
        " nothing from this batch was stored"
    )


class _BinaryArray(bytes):
    """A column's values as a PostgreSQL binary array; a subclass per element type
    (_ARRAY_TYPES) carries its array type's oid to psycopg."""

    oid: int


class _ArrayDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


def _array_type(kind: str) -> type[_BinaryArray]:
    oid = columns.OIDS[kind][1]
    made = type(f"BinaryArray_{kind}", (_BinaryArray,), {"oid": oid})
    psycopg.adapters.register_dumper(made, type(f"Dumper_{kind}", (_ArrayDumper,), {"oid": oid}))
    return made


_ARRAY_TYPES = {kind: _array_type(kind) for kind in columns.OIDS}
_SELECTED = {c.name: columns.select_value(c) for c in columns.COLUMNS}
# the names are the table's own (service.tables), not input; the arrays are parameters
_COLUMNS = ", ".join(WINDOW_COLUMNS)
_VALUES = ", ".join(
    "%(batch_id)s" if name == columns.SCALAR else _SELECTED[name] for name in WINDOW_COLUMNS
)
_UNNESTED = ", ".join(f"%({c.name})s" for c in columns.COLUMNS)
_UNNESTED_AS = ", ".join(c.name for c in columns.COLUMNS)
assert set(_SELECTED) | {columns.SCALAR} == set(WINDOW_COLUMNS)
_CLAIM = (
    "INSERT INTO telemetry_batches (batch_id, node_id, windows, digest)"
    " SELECT %(batch_id)s, %(node_id)s, %(count)s, %(digest)s"
    " WHERE NOT EXISTS (SELECT FROM clash)"
    " ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id"
)
assert TelemetryBatchRow.__tablename__ == "telemetry_batches"  # the statement's table
# A window's counters are bounded by its span (agent.contract.base), which bounds a device's
# sums only if its windows do not overlap: a window that overlaps another of its device —
# stored before, or in the same batch — stops the batch before anything is claimed or stored,
# and the first such pair is returned (device id, the window's start and end, the other's
# start and end, whether the other is in the batch). A stored window overlapping [s, e)
# starts after s - MAX_WINDOW_SPAN and before e: one range of the primary key's index per
# window; the batch's own windows are compared with their predecessor in start order.
_STORE = f"""
WITH u AS MATERIALIZED (
    SELECT * FROM unnest({_UNNESTED}) AS u({_UNNESTED_AS})  -- side by side: the n-th of each
),
ordered AS (
    SELECT u.device_id, u.window_start, u.window_end,
        lag(u.window_start) OVER w AS other_start, lag(u.window_end) OVER w AS other_end
    FROM u WINDOW w AS (PARTITION BY u.device_id ORDER BY u.window_start, u.window_end)
),
clash AS (
    (SELECT o.device_id, o.window_start, o.window_end, o.other_start, o.other_end, true AS inside
     FROM ordered o WHERE o.other_end > o.window_start LIMIT 1)
    UNION ALL
    (SELECT n.device_id, n.window_start, n.window_end, s.window_start, s.window_end, false
     FROM u n CROSS JOIN LATERAL (
         SELECT w.window_start, w.window_end FROM {RAW} w
         WHERE w.device_id = n.device_id
           AND w.window_start > n.window_start - %(span)s AND w.window_start < n.window_end
           AND w.window_start >= %(low)s AND w.window_start < %(high)s  -- the partitions: once
           AND w.window_end > n.window_start
         LIMIT 1) s
     LIMIT 1)
),
claim AS ({_CLAIM}),
stored AS (
    INSERT INTO {RAW} ({_COLUMNS})
    SELECT {_VALUES}
    FROM u
    WHERE EXISTS (SELECT FROM claim)
    RETURNING 1
)
SELECT (SELECT count(*) FROM claim), (SELECT count(*) FROM stored),
    (SELECT json_build_array(c.device_id, c.window_start, c.window_end, c.other_start,
        c.other_end, c.inside) FROM clash c LIMIT 1)
"""  # noqa: S608


def claimed_batch(session: Session, batch_id: uuid.UUID) -> tuple[uuid.UUID, str | None] | None:
    """Who sent a batch id before, and the digest of what it held."""
    row = session.execute(
        select(TelemetryBatchRow.node_id, TelemetryBatchRow.digest).where(
            TelemetryBatchRow.batch_id == batch_id
        )
    ).one_or_none()
    return (row.node_id, row.digest) if row is not None else None


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
# No device's rows can make the statement fail for the others: a device's counters sum as
# numeric (sum of BIGINT) and are clamped into BIGINT — windows that do not overlap (ingest
# refuses those that do) stay far inside it, and whatever was stored before that rule, or
# slipped past it, clamps its own device-hour — and each float is clamped to the contract's
# bound before it is summed (rows stored before the contract bounded them held up to 1e308,
# whose sum overflows double precision).
_BIGINT = 2**63 - 1
_ROLL_UP = f"""
INSERT INTO {HOURLY} (device_id, hour, windows, seconds, read_ios, write_ios, read_bytes,
    write_bytes, queue_depth_seconds, busy_seconds, latency_us_ios, energy_joules, max_p99_us,
    operations, rolled_up_at)
SELECT w.device_id, date_trunc('hour', w.window_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
    count(*), sum(extract(epoch FROM w.window_end - w.window_start)),
    least(sum(w.read_ios), {_BIGINT}), least(sum(w.write_ios), {_BIGINT}),
    least(sum(w.read_bytes), {_BIGINT}), least(sum(w.write_bytes), {_BIGINT}),
    sum(least(w.queue_depth, {MAX_DEPTH}) * extract(epoch FROM w.window_end - w.window_start)),
    sum(least(w.utilisation, 1.0) * extract(epoch FROM w.window_end - w.window_start)),
    sum(least(w.mean_latency_us, {MAX_MICROS}) * (w.read_ios::float8 + w.write_ios::float8)),
    sum(least(w.energy_joules, {MAX_JOULES})), max(w.p99_us), NULL, now()
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

# each device-hour's eBPF histograms, merged in Python (service.telemetry.hourly): the raw
# windows' operations as stored, a device's hours one after another
_HOUR_OPERATIONS = f"""
SELECT w.device_id,
    date_trunc('hour', w.window_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
    w.operations::text AS operations
FROM {RAW} w
WHERE w.operations IS NOT NULL AND w.window_start >= :low AND w.window_start < :high
ORDER BY w.device_id, w.window_start
"""  # noqa: S608
_SET_HOUR_OPERATIONS = f"""
UPDATE {HOURLY} h SET operations = v.operations
FROM json_to_recordset(CAST(:rows AS json)) AS v(device_id uuid, hour timestamptz, operations jsonb)
WHERE h.device_id = v.device_id AND h.hour = v.hour
"""  # noqa: S608
_HOURS_PER_UPDATE = 1000  # device-hours' merged histograms sent in one statement


@dataclass
class RolledUp:
    """What roll_up wrote: `hours`, device-hours; `unreadable`, the device-hours whose stored
    histograms do not parse (their sums are written, their operations left NULL)."""

    hours: int = 0
    unreadable: list[tuple[uuid.UUID, datetime, str]] = field(default_factory=list)


def roll_up(connection: Connection, low: datetime, high: datetime) -> RolledUp:
    """(Re)compute the hourly rows of every hour in [low, high) from the raw windows there.
    Each device-hour's histograms are merged on their own: one whose stored histograms do not
    parse is reported in `unreadable` and keeps its sums, and no other device-hour is
    touched by it."""
    bounds = {"low": low, "high": high}
    result = RolledUp(int(connection.execute(text(_ROLL_UP), bounds).rowcount or 0))
    rows = connection.execute(
        text(_HOUR_OPERATIONS), bounds, execution_options={"yield_per": 2000}
    )  # a server-side cursor: a few thousand windows in memory, not the hours
    merged: list[dict[str, Any]] = []
    for (device_id, hour), group in groupby(rows, key=lambda row: (row[0], row[1])):
        try:
            operations = hourly.merge_hour(row[2] for row in group)
        except hourly.UnreadableHistograms as error:
            result.unreadable.append((device_id, hour, str(error)))
            continue
        if not operations:  # no histogram has a pair: the hour's operations stay NULL
            continue
        merged.append({"device_id": device_id, "hour": hour, "operations": operations})
        if len(merged) >= _HOURS_PER_UPDATE:
            _set_hour_operations(connection, merged)
            merged = []
    if merged:
        _set_hour_operations(connection, merged)
    return result


def _set_hour_operations(connection: Connection, merged: list[dict[str, Any]]) -> None:
    connection.execute(text(_SET_HOUR_OPERATIONS), {"rows": msgspec.json.encode(merged).decode()})


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
