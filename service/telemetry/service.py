from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy.orm import Session

from agent.contract.base import MAX_CLOCK_SKEW
from agent.contract.wire import OperationLatency, TelemetryBatch, TelemetryBatchReceipt
from service.devices import repository as device_repository
from service.devices import service as device_service
from service.errors import ClockAhead, Conflict, Unprocessable
from service.fastwire import FastDecoder
from service.nodes.cache import NODES
from service.ops import metrics
from service.ops.transactions import on_commit
from service.security import Principal
from service.tables import TelemetryHourlyRow, TelemetryWindowRow
from service.telemetry import columns, distributions, repository, retention
from service.telemetry.retention import RetentionPolicy

log = logging.getLogger(__name__)

# a batch as it arrives: TelemetryBatch's fields in a msgspec struct (service.fastwire), which
# mypy knows only as Any; each operation's histograms are kept as the JSON they came in and
# checked batch-wide, in arrays
BATCHES = FastDecoder(
    TelemetryBatch,
    deferred=[OperationLatency._consistent],
    whole=distributions.check,
    raw=[(OperationLatency, name) for name in ("device_ns", "queue_ns", "size_bytes")],
)


def ingest(
    session: Session,
    node: Principal,
    batch: Any,
    policy: RetentionPolicy | None = None,
    checked: Any = None,
) -> TelemetryBatchReceipt:
    """Store a batch whole or not at all; a batch id seen before is acknowledged, not stored.
    `checked`: what BATCHES' whole check returned of the batch (its device-time histograms,
    read once), or None: read again here.

    Windows may name devices the node no longer has (spooled before they went away);
    only names the node never reported are unknown.
    """
    assert node.node_id is not None
    if isinstance(batch, TelemetryBatch):  # a caller in process (tests, the demo's seeding)
        batch = BATCHES.from_model(batch)
    retention.ensure_days(session, policy or RetentionPolicy(), (w.start for w in batch.windows))
    device_ids = _device_ids(session, node.node_id, {w.device for w in batch.windows})
    unknown = [
        {"loc": ["body", "windows", index, "device"], "msg": f"unknown device {window.device!r}"}
        for index, window in enumerate(batch.windows)
        if window.device not in device_ids
    ]
    if unknown:
        names = sorted({str(field["msg"]).split()[-1] for field in unknown})
        raise Unprocessable(
            f"{len(unknown)} window(s) name devices this node has not reported in its inventory:"
            f" {', '.join(names)}; nothing from this batch was stored",
            fields=unknown,
        )
    latest = datetime.now(UTC) + MAX_CLOCK_SKEW
    future = [
        {
            "loc": ["body", "windows", index, "end"],
            "msg": f"ends {window.end.isoformat()}, after {latest:%Y-%m-%dT%H:%M:%SZ}",
        }
        for index, window in enumerate(batch.windows)
        if window.end > latest
    ]
    if future:
        raise ClockAhead(
            f"{len(future)} window(s) end in the future, more than {MAX_CLOCK_SKEW} past this"
            " server's clock: check the node's clock (NTP); nothing from this batch was stored",
            fields=future,
        )
    keys = [(w.device, w.start, w.end) for w in batch.windows]
    if len(set(keys)) != len(keys):
        raise Unprocessable("the batch holds the same device and interval twice")

    encoded = encode_batch(batch, device_ids, checked)
    stored = repository.store_batch(session, batch.batch_id, node.node_id, encoded.stored)
    if not stored.claimed:
        owner, earlier = repository.claimed_batch(session, batch.batch_id) or (None, None)
        if owner is None and stored.overlaps is not None:
            raise _overlapping(stored.overlaps, device_ids)
        if owner != node.node_id:
            raise Conflict(f"batch id {batch.batch_id} was already used by another node")
        if earlier is not None and not _same_batch(earlier, encoded.stored.digest, batch):
            raise Conflict(
                f"batch id {batch.batch_id} was received before with other content: a batch id"
                " names one batch; nothing from this one was stored"
            )
        on_commit(session, lambda: metrics.TELEMETRY_BATCHES.labels(outcome="duplicate").inc())
        return TelemetryBatchReceipt(batch_id=batch.batch_id, accepted=False, windows=0)
    count = stored.windows

    on_commit(session, lambda: _count_ingested(count, encoded.p99s))
    return TelemetryBatchReceipt(batch_id=batch.batch_id, accepted=True, windows=count)


async def ingest_pushed(
    pushes: AsyncConnectionPool,
    node: Principal,
    batch: Any,
    policy: RetentionPolicy | None = None,
    checked: Any = None,
) -> TelemetryBatchReceipt | None:
    """`ingest` on the event loop, for the push its caches answer: windows within the raw
    retention and none in the future, on days whose partitions are known to exist, naming
    devices the node is known to have, no device and interval twice — stored by one
    statement on a connection of `pushes` (service.db.push_connections), committed when it
    returns. None where anything else is so (a batch id claimed before, a connection that
    failed — its statement committed nothing, or committed the batch, which `ingest` then
    finds claimed — or a window stored before, in this batch or another: the table's primary
    key refused it, and nothing was stored): `ingest` takes the batch in a unit of work and
    answers for it, refusals and their reasons included. A batch that names a device and
    interval twice is left to the primary key, not looked for window by window: hashing
    every window's two datetimes cost 0.44 µs a window, a seventeenth of serve's CPU for a
    500-window batch."""
    assert node.node_id is not None
    now = datetime.now(UTC)
    oldest = (policy or RetentionPolicy()).raw_horizon(now)
    latest = now + MAX_CLOCK_SKEW
    known = NODES.devices(node.node_id)
    if known is None:
        return None
    days = set()
    for w in batch.windows:
        if w.start < oldest or w.end > latest or w.device not in known:
            return None
        days.add(w.start.astimezone(UTC).date())
    if retention.CACHE.missing(days):
        return None
    encoded = encode_batch(batch, known, checked)
    try:
        async with pushes.connection() as connection:
            stored = await repository.store_pushed_batch(
                connection, batch.batch_id, node.node_id, encoded.stored
            )
    except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as error:
        log.warning("a push's connection failed (%s); taking it in a unit of work", error)
        metrics.TELEMETRY_PUSH_PATH.labels(path="connection_failed").inc()
        return None
    except Conflict:  # a window stored before: `ingest` says which way
        return None
    if not stored.claimed:
        return None
    metrics.TELEMETRY_PUSH_PATH.labels(path="event_loop").inc()
    _count_ingested(stored.windows, encoded.p99s)
    return TelemetryBatchReceipt(batch_id=batch.batch_id, accepted=True, windows=stored.windows)


def _overlapping(
    overlap: repository.Overlap, device_ids: dict[str, uuid.UUID]
) -> Conflict | Unprocessable:
    """The first window of a batch that overlaps another of its device, named: a device's
    windows may not overlap (their counters would be counted twice, and sums that the
    contract keeps inside BIGINT would not stay there)."""
    name = next((n for n, i in device_ids.items() if i == overlap.device_id), "?")
    if (overlap.start, overlap.end) == (overlap.other_start, overlap.other_end):
        if not overlap.in_batch:
            return repository.stored_before(
                f"window {name} {overlap.start.isoformat()} … {overlap.end.isoformat()}"
            )
        return Unprocessable("the batch holds the same device and interval twice")
    where = "another window of this batch" if overlap.in_batch else "a window stored before"
    # within the batch: the batch is not acceptable as it is (422); against a stored window:
    # it conflicts with what is stored (409)
    error = Unprocessable if overlap.in_batch else Conflict
    return error(
        f"window {name} {overlap.start.isoformat()} … {overlap.end.isoformat()} overlaps"
        f" {where}, {overlap.other_start.isoformat()} … {overlap.other_end.isoformat()}:"
        " a device's windows may not overlap; nothing from this batch was stored",
        fields=[{"loc": ["body", "windows"], "msg": f"{name} overlaps another window"}],
    )


def _same_batch(earlier: str, digest: str, batch: Any) -> bool:
    """Whether a claimed batch's digest is this batch's, as this service computes it now or
    computed it before (earlier_digests)."""
    return earlier == digest or any(earlier == d for d in earlier_digests(batch))


def _count_ingested(count: int, p99s: list[float]) -> None:
    metrics.TELEMETRY_BATCHES.labels(outcome="accepted").inc()
    metrics.TELEMETRY_WINDOWS.inc(count)
    for p99 in p99s:
        metrics.WINDOW_P99.observe(p99 / 1e6)


def _device_ids(session: Session, node_id: uuid.UUID, names: set[str]) -> dict[str, uuid.UUID]:
    """The node's device ids by name, from this process's cache where it holds every name
    asked for (service.nodes.cache), else from the database."""
    known = NODES.devices(node_id)
    if known is not None and names <= known.keys():
        return known
    found = device_repository.ids_by_name(session, node_id)
    NODES.remember_devices(node_id, found)
    return found


@dataclass(frozen=True)
class EncodedBatch:
    """A batch as the repository stores it (its digest, and each column of its windows as a
    binary array: service.telemetry.columns) and the windows' device-time p99s that there
    are, in µs, for the metrics."""

    stored: repository.EncodedWindows
    p99s: list[float]


def encode_batch(batch: Any, device_ids: dict[str, uuid.UUID], checked: Any = None) -> EncodedBatch:
    """The batch encoded for the statement that stores it: each column of its windows as one
    binary array (columns.encode), with each device's id and each window's device-time
    percentiles, from the batch's histograms merged and read in arrays (distributions;
    `checked`: what BATCHES' whole check returned of the batch, where given), and the
    digest of the windows' content (batch_digest's)."""
    found = distributions.window_percentiles(batch.windows, checked)
    encoded = columns.encode(batch.windows, device_ids, found)
    stored = repository.EncodedWindows(
        digest=encoded.digest,
        arrays=encoded.arrays,
        count=len(batch.windows),
        low=min(w.start for w in batch.windows),
        high=max(w.end for w in batch.windows),
    )
    return EncodedBatch(stored, [p[1] for p in found if p is not None])


def batch_digest(batch: Any) -> str:
    """SHA-256 of the batch's windows' content (columns.encode's digest: their values as
    stored, and their devices' names — whatever the bytes sent): the same batch resent by a
    spool has the same digest. Neither the node's device ids nor the percentiles enter it."""
    names = {w.device: _NO_ID for w in batch.windows}
    return columns.encode(batch.windows, names, [None] * len(batch.windows)).digest


_NO_ID = uuid.UUID(int=0)


def earlier_digests(batch: Any) -> Iterator[str]:
    """The digests this service computed of the same batch before batch_digest, newest first,
    for a batch claimed then and resent now: the batch's canonical JSON (msgspec's,
    from 2026-11-27) and pydantic's JSON before it. Computed one at a time, only
    for a resent batch whose digest differs."""
    canonical = BATCHES.encode(batch)
    yield hashlib.sha256(canonical).hexdigest()
    model = TelemetryBatch.model_validate_json(canonical)
    yield hashlib.sha256(model.model_dump_json().encode()).hexdigest()


def windows_for_device(
    session: Session,
    principal: Principal,
    device_id: uuid.UUID,
    *,
    since: datetime | None,
    until: datetime | None,
    limit: int,
) -> Sequence[TelemetryWindowRow]:
    device_service.get_device(session, principal, device_id)
    return repository.windows_for_device(session, device_id, since=since, until=until, limit=limit)


def hours_for_device(
    session: Session,
    principal: Principal,
    device_id: uuid.UUID,
    *,
    since: datetime,
    until: datetime | None,
) -> Sequence[TelemetryHourlyRow]:
    device_service.get_device(session, principal, device_id)
    return repository.hourly_for_device(session, device_id, since=since, until=until)
