"""Telemetry that stays bounded: day partitions of raw windows made ready ahead of time, rolled
up into hourly rows, and dropped past the raw retention; monthly partitions of the hourly rows
dropped past theirs.

`maintain` is one pass. `blkpilot serve` runs it at start and then every few minutes
(MaintenanceWorker); with several replicas on one database, a session advisory lock lets one
of them do a pass at a time and the others skip it. `blkpilot telemetry maintain` runs a pass
by hand. Ingest creates a missing day partition for a plausible window by itself
(ensure_days), so nothing waits on the worker.

The rollups are exact when it matters: a day is rolled up once more, whole, just before its
partition is dropped, so windows that arrived late (a node's spool after an outage) are in.
Hours since the last pass are rolled up as they close, so that the hourly rows are current too.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from agent.contract.base import MAX_CLOCK_SKEW
from service.devices import repository as devices_repository
from service.errors import Unprocessable
from service.ops import metrics
from service.ops.transactions import on_commit
from service.telemetry import repository
from service.telemetry.repository import HOURLY, RAW, Partition

log = logging.getLogger(__name__)
# what makes an hour fail to roll up: a statement the database refuses. (A device's sums are
# clamped into BIGINT and its histograms merged on their own: neither stops another device.)
_CANNOT_ROLL_UP = (DBAPIError,)

MAINTENANCE_LOCK = 0x626C6B71
# an hour is rolled up this long after it ends (windows still on their way)
SETTLE = timedelta(minutes=15)


@dataclass(frozen=True)
class RetentionPolicy:
    raw_days: int = 14
    hourly_days: int = 400
    ahead_days: int = 3

    def raw_horizon(self, now: datetime) -> datetime:
        """The start of the oldest day kept raw."""
        oldest = (now - timedelta(days=self.raw_days)).date()
        return datetime(oldest.year, oldest.month, oldest.day, tzinfo=UTC)


@dataclass
class MaintenanceReport:
    ran: bool  # False: another process held the lock
    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    rolled_up: int = 0  # device-hours written
    failed_hours: list[datetime] = field(default_factory=list)  # set aside, moved past
    # device-hours rolled up without their histograms, which did not parse (device id, hour)
    unreadable: list[tuple[uuid.UUID, datetime]] = field(default_factory=list)
    windows_set_aside: int = 0  # raw windows of failed hours kept when their day was dropped
    batches_forgotten: int = 0
    counts_folded: int = 0  # device_counts rows folded away


def _days(first: date, last: date) -> Iterable[date]:
    day = first
    while day <= last:
        yield day
        day += timedelta(days=1)


def maintain(
    engine: Engine, policy: RetentionPolicy, now: datetime | None = None
) -> MaintenanceReport:
    """One pass: partitions ahead, closed hours rolled up, expired days rolled up whole and
    dropped, expired months dropped, batch ids past retention forgotten."""
    now = now or datetime.now(UTC)
    with engine.connect() as lock:
        if not repository.try_maintenance_lock(lock, MAINTENANCE_LOCK):
            lock.rollback()
            return MaintenanceReport(ran=False)
        lock.commit()
        try:
            return _pass(engine, policy, now)
        finally:
            repository.release_maintenance_lock(lock, MAINTENANCE_LOCK)
            lock.commit()


def _pass(engine: Engine, policy: RetentionPolicy, now: datetime) -> MaintenanceReport:
    report = MaintenanceReport(ran=True)
    horizon = policy.raw_horizon(now)
    today = now.date()
    days = list(_days(horizon.date(), today + timedelta(days=policy.ahead_days)))
    months = {repository.month_partition(d) for d in days}
    with engine.begin() as connection:
        report.created += repository.create_partitions(
            connection, RAW, [repository.day_partition(d) for d in days]
        )
        report.created += repository.create_partitions(
            connection, HOURLY, sorted(months, key=lambda p: p.low)
        )

    # the hours closed since the last pass (within what is kept raw)
    closed = (now - SETTLE).replace(minute=0, second=0, microsecond=0)
    with engine.connect() as connection:
        last = repository.last_rolled_hour(connection)
        start = max(horizon, last + timedelta(hours=1)) if last else horizon
    if start < closed:
        _roll_up(engine, start, closed, report)

    with engine.connect() as connection:
        expired = [p for p in repository.partitions(connection, RAW) if p.high <= horizon]
    for partition in expired:
        # rolled up whole once more, then dropped, in one transaction: the hours and the raw
        # windows never both go missing
        with engine.begin() as connection:
            repository.create_partitions(
                connection, HOURLY, [repository.month_partition(partition.low.date())]
            )
            _roll_up_before_drop(connection, partition.low, partition.high, report)
            repository.drop_partition(connection, partition)
        CACHE.discard([partition.table])
        report.dropped.append(partition.table)

    hourly_horizon = now - timedelta(days=policy.hourly_days)
    with engine.begin() as connection:
        for partition in repository.partitions(connection, HOURLY):
            if partition.high <= hourly_horizon:
                repository.drop_partition(connection, partition)
                report.dropped.append(partition.table)
        report.batches_forgotten = repository.forget_batches(connection, horizon)
    with engine.begin() as connection:
        # the device counts' +1/-1 rows since the last pass, folded (one row per key)
        report.counts_folded = devices_repository.fold_counts(connection)
    if report.failed_hours:
        log.error(
            "telemetry rollup failed for %d hour(s), set aside and moved past: %s"
            " (see telemetry_rollup_failures)",
            len(report.failed_hours),
            ", ".join(f"{h:%Y-%m-%d %H:00}" for h in report.failed_hours),
        )
    if report.created or report.dropped:
        log.info(
            "telemetry partitions: created %s, dropped %s; %d device-hours rolled up",
            report.created or "none",
            report.dropped or "none",
            report.rolled_up,
        )
    return report


def _hours(low: datetime, high: datetime) -> Iterable[datetime]:
    hour = low.replace(minute=0, second=0, microsecond=0)
    while hour < high:
        yield hour
        hour += timedelta(hours=1)


def _roll_up(engine: Engine, low: datetime, high: datetime, report: MaintenanceReport) -> None:
    """The hours in [low, high) in one statement; if that fails, hour by hour, each in its own
    transaction, so that one hour that cannot be rolled up (a row whose sums do not fit) is
    recorded and moved past instead of stopping every later hour."""
    try:
        with engine.begin() as connection:
            _rolled(report, repository.roll_up(connection, low, high))
        return
    except _CANNOT_ROLL_UP as error:
        log.warning(
            "telemetry rollup of %s … %s failed (%s); trying hour by hour",
            low,
            high,
            _reason(error),
        )
    for hour in _hours(low, high):
        try:
            with engine.begin() as connection:
                _rolled(report, repository.roll_up(connection, hour, hour + timedelta(hours=1)))
                repository.clear_rollup_failure(connection, hour)
        except _CANNOT_ROLL_UP as error:
            with engine.begin() as connection:
                repository.record_rollup_failure(connection, hour, _reason(error))
            _failed(report, hour)


def _roll_up_before_drop(
    connection: Connection, low: datetime, high: datetime, report: MaintenanceReport
) -> None:
    """A day rolled up whole once more before its partition goes, in the dropping transaction;
    an hour that still fails has its raw windows moved to the set-aside table first."""
    try:
        with connection.begin_nested():
            _rolled(report, repository.roll_up(connection, low, high))
        return
    except _CANNOT_ROLL_UP:
        pass
    for hour in _hours(low, high):
        try:
            with connection.begin_nested():
                _rolled(report, repository.roll_up(connection, hour, hour + timedelta(hours=1)))
                repository.clear_rollup_failure(connection, hour)
        except _CANNOT_ROLL_UP as error:
            repository.record_rollup_failure(connection, hour, _reason(error))
            report.windows_set_aside += repository.set_aside_hour(connection, hour)
            _failed(report, hour)


def _rolled(report: MaintenanceReport, rolled: repository.RolledUp) -> None:
    report.rolled_up += rolled.hours
    for device_id, hour, why in rolled.unreadable:
        log.warning(
            "telemetry rollup: device %s's histograms of %s do not parse (%s); its hour is"
            " rolled up without them",
            device_id,
            f"{hour:%Y-%m-%d %H:00}",
            why,
        )
        report.unreadable.append((device_id, hour))
        metrics.TELEMETRY_ROLLUP_UNREADABLE.inc()


def _reason(error: Exception) -> str:
    if isinstance(error, DBAPIError) and error.orig is not None:
        return str(error.orig).strip()
    return str(error)


def _failed(report: MaintenanceReport, hour: datetime) -> None:
    report.failed_hours.append(hour)
    metrics.TELEMETRY_ROLLUP_FAILURES.inc()


class PartitionCache:
    """The day partitions this process knows exist, so that ingest asks the catalog only for a
    day it has not seen (a new day, or one another process created)."""

    def __init__(self) -> None:
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def missing(self, days: Iterable[date]) -> list[Partition]:
        with self._lock:
            return [
                p
                for d in sorted(set(days))
                if (p := repository.day_partition(d)).table not in self._known
            ]

    def add(self, tables: Iterable[str]) -> None:
        with self._lock:
            self._known.update(tables)

    def discard(self, tables: Iterable[str]) -> None:
        with self._lock:
            self._known.difference_update(tables)

    def clear(self) -> None:
        with self._lock:
            self._known.clear()


CACHE = PartitionCache()


def ensure_days(
    session: Session,
    policy: RetentionPolicy,
    starts: Iterable[datetime],
    now: datetime | None = None,
) -> None:
    """Make sure every window start has its day partition; a window older than the raw
    retention is refused (it would be dropped at once, and rollups of that day are final).
    A missing partition is made in the batch's own transaction."""
    now = now or datetime.now(UTC)
    horizon = policy.raw_horizon(now)
    starts = list(starts)
    too_old = [s for s in starts if s < horizon]
    if too_old:
        raise Unprocessable(
            f"{len(too_old)} window(s) start before {horizon:%Y-%m-%d}, past this server's raw"
            f" telemetry retention ({policy.raw_days} days): nothing from this batch was stored"
        )
    # (a start in the future is refused by ingest's own check, with its field)
    latest = now + MAX_CLOCK_SKEW
    days = {s.astimezone(UTC).date() for s in starts if s <= latest}
    if not CACHE.missing(days):
        return
    CACHE.add(p.table for p in repository.partitions(session, RAW))
    missing = CACHE.missing(days)
    if not missing:
        return
    # made in the request's own transaction: a request never holds two connections
    # (ConnectionAdmissionMiddleware admits one request per connection). Creating a partition
    # locks the table until the batch commits; the upkeep makes days ahead so that ingest
    # seldom has to.
    repository.create_partitions(session.connection(), RAW, missing)
    on_commit(session, lambda: CACHE.add(p.table for p in missing))


class MaintenanceWorker:
    """`blkpilot serve`'s thread that runs a maintenance pass at start and then every
    `interval` seconds."""

    def __init__(
        self,
        engine: Engine,
        policy: RetentionPolicy,
        interval: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine, self.policy, self.interval, self.clock = engine, policy, interval, clock
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="telemetry-upkeep", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                report = maintain(self.engine, self.policy, self.clock())
            except Exception:
                metrics.TELEMETRY_UPKEEP.labels(outcome="failed").inc()
                log.exception("telemetry maintenance pass failed; trying again later")
            else:
                metrics.TELEMETRY_UPKEEP.labels(outcome="ran" if report.ran else "skipped").inc()
                metrics.TELEMETRY_PARTITIONS.labels(action="created").inc(len(report.created))
                metrics.TELEMETRY_PARTITIONS.labels(action="dropped").inc(len(report.dropped))
            self.stopping.wait(self.interval)

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)
