from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from agent.contract.base import MAX_CLOCK_SKEW
from agent.contract.wire import OperationLatency, TelemetryBatch, TelemetryBatchReceipt
from service.devices import repository as device_repository
from service.devices import service as device_service
from service.errors import Conflict, Unprocessable
from service.fastwire import FastDecoder
from service.nodes.cache import NODES
from service.ops import metrics
from service.ops.transactions import on_commit
from service.security import Principal
from service.tables import TelemetryHourlyRow, TelemetryWindowRow
from service.telemetry import distributions, repository, retention
from service.telemetry.retention import RetentionPolicy

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
        raise Unprocessable(
            f"{len(future)} window(s) end in the future, more than {MAX_CLOCK_SKEW} past this"
            " server's clock: check the node's clock (NTP); nothing from this batch was stored",
            fields=future,
        )
    keys = [(w.device, w.start, w.end) for w in batch.windows]
    if len(set(keys)) != len(keys):
        raise Unprocessable("the batch holds the same device and interval twice")

    digest = batch_digest(batch)
    rows = window_rows(batch, device_ids, checked)
    count = repository.store_batch(session, batch.batch_id, node.node_id, digest, rows)
    if count is None:
        owner, earlier = repository.claimed_batch(session, batch.batch_id) or (None, None)
        if owner != node.node_id:
            raise Conflict(f"batch id {batch.batch_id} was already used by another node")
        if earlier is not None and earlier not in (digest, pydantic_digest(batch)):
            raise Conflict(
                f"batch id {batch.batch_id} was received before with other content: a batch id"
                " names one batch; nothing from this one was stored"
            )
        on_commit(session, lambda: metrics.TELEMETRY_BATCHES.labels(outcome="duplicate").inc())
        return TelemetryBatchReceipt(batch_id=batch.batch_id, accepted=False, windows=0)

    p99s = [p99 for row in rows if (p99 := row["p99_us"]) is not None]

    def count_ingested() -> None:
        metrics.TELEMETRY_BATCHES.labels(outcome="accepted").inc()
        metrics.TELEMETRY_WINDOWS.inc(count)
        for p99 in p99s:
            metrics.WINDOW_P99.observe(p99 / 1e6)

    on_commit(session, count_ingested)
    return TelemetryBatchReceipt(batch_id=batch.batch_id, accepted=True, windows=count)


def _device_ids(session: Session, node_id: uuid.UUID, names: set[str]) -> dict[str, uuid.UUID]:
    """The node's device ids by name, from this process's cache where it holds every name
    asked for (service.nodes.cache), else from the database."""
    known = NODES.devices(node_id)
    if known is not None and names <= known.keys():
        return known
    found = device_repository.ids_by_name(session, node_id)
    NODES.remember_devices(node_id, found)
    return found


def batch_digest(batch: Any) -> str:
    """SHA-256 of the batch's canonical JSON (msgspec's, whatever the bytes sent): the same
    batch resent by a spool has the same digest."""
    return hashlib.sha256(BATCHES.encode(batch)).hexdigest()


def pydantic_digest(batch: Any) -> str:
    """The digest as this service computed it before msgspec (pydantic's JSON), for a batch
    claimed then and resent now: the two JSONs agree on the batches agents send
    (tests/service/test_fastwire.py), this covers any they do not."""
    model = TelemetryBatch.model_validate_json(BATCHES.encode(batch))
    return hashlib.sha256(model.model_dump_json().encode()).hexdigest()


def window_rows(
    batch: Any, device_ids: dict[str, uuid.UUID], checked: Any = None
) -> list[dict[str, Any]]:
    """The batch's windows as the raw table stores them, each with its device-time
    percentiles (the batch's histograms merged and read in arrays: distributions, from
    `checked`, what its check returned, where given)."""
    summaries = distributions.window_summaries(batch.windows, checked)
    return [
        window_row(w, device_ids[w.device], batch.batch_id, summary)
        for w, summary in zip(batch.windows, summaries, strict=True)
    ]


def window_row(
    w: Any, device_id: uuid.UUID, batch_id: uuid.UUID, percentiles: dict[str, float | None]
) -> dict[str, Any]:
    """A window as the raw table stores it; percentiles: window_percentiles_us's."""
    return {
        "device_id": device_id,
        "batch_id": batch_id,
        "window_start": w.start,
        "window_end": w.end,
        "read_ios": w.read_ios,
        "write_ios": w.write_ios,
        "read_bytes": w.read_bytes,
        "write_bytes": w.write_bytes,
        "iops": w.iops,
        "read_share": w.read_share,
        "mean_request_bytes": w.mean_request_bytes,
        "mean_latency_us": w.mean_latency_us,
        "queue_depth": w.queue_depth,
        "utilisation": w.utilisation,
        "power_watts": w.power_watts,
        "energy_joules": w.energy_joules,
        "power_scope": w.power_scope and w.power_scope.value,
        "cpu_utilisation": w.cpu_utilisation,
        "context_switches_per_s": w.context_switches_per_s,
        "power_source": w.power_source and w.power_source.value,
        # structs as they came: encode_rows writes them as JSON, as they were sent
        "power_readings": w.power_readings or None,
        "latency_source": w.latency_source.value,
        "latency_note": w.latency_note,
        "operations": w.operations or None,
        **percentiles,
    }


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
