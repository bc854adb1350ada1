from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from agent.contract.wire import TelemetryBatch, TelemetryBatchReceipt, TelemetryWindow
from agent.errors import ServiceRejected, ServiceUnreachable
from agent.spool import MEMO_BATCHES, Spool
from tests.factories import telemetry_window


def _batch(index: int) -> TelemetryBatch:
    window = TelemetryWindow.model_validate(telemetry_window("loop0", index=index))
    return TelemetryBatch(batch_id=uuid.uuid4(), windows=[window])


class Service:
    """Acknowledges like the real ingest endpoint: once stored, a batch id is a duplicate."""

    def __init__(self) -> None:
        self.stored: list[uuid.UUID] = []
        self.failure: Exception | None = None

    def send(self, batch: TelemetryBatch) -> TelemetryBatchReceipt:
        if self.failure is not None:
            raise self.failure
        duplicate = batch.batch_id in self.stored
        if not duplicate:
            self.stored.append(batch.batch_id)
        return TelemetryBatchReceipt(batch_id=batch.batch_id, accepted=not duplicate, windows=1)


def test_drains_in_order_and_only_after_acknowledgement(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    batches = [_batch(i) for i in range(5)]
    for batch in batches:
        spool.put(batch)
    service = Service()
    service.failure = ServiceUnreachable("connection refused")
    result = spool.drain(service.send)
    assert result.stopped.startswith("service unreachable")
    assert len(spool.pending()) == 5
    service.failure = None
    result = spool.drain(service.send)
    assert (result.sent, result.stopped) == (5, "")
    assert service.stored == [b.batch_id for b in batches]
    assert spool.pending() == []


def test_survives_a_restart_and_keeps_numbering(tmp_path: Path) -> None:
    Spool(tmp_path).put(_batch(0))
    reopened = Spool(tmp_path)
    reopened.put(_batch(1))
    names = [p.name for p in reopened.pending()]
    assert names == ["0000000000000001.json", "0000000000000002.json"]


def test_resending_an_acknowledged_batch_is_harmless(tmp_path: Path) -> None:
    """A crash between the service's acknowledgement and the file's removal resends it."""
    spool = Spool(tmp_path)
    batch = _batch(0)
    spool.put(batch)
    service = Service()
    service.stored.append(batch.batch_id)  # stored before the crash
    result = spool.drain(service.send)
    assert (result.sent, result.duplicates) == (0, 1)
    assert spool.pending() == []


def test_invalid_batches_go_to_rejected_with_the_reason(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put(_batch(0))
    spool.put(_batch(1))
    calls = []

    def refuse_first(batch: TelemetryBatch) -> TelemetryBatchReceipt:
        calls.append(batch.batch_id)
        if len(calls) == 1:
            raise ServiceRejected(422, "unprocessable", "unknown device 'loop0'")
        return TelemetryBatchReceipt(batch_id=batch.batch_id, accepted=True, windows=1)

    result = spool.drain(refuse_first)
    assert (result.sent, result.rejected) == (1, 1)
    (reason,) = spool.rejected_dir.glob("*.reason")
    assert "unknown device" in reason.read_text()
    assert spool.pending() == []


def test_server_errors_and_auth_failures_keep_the_batch(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put(_batch(0))
    for status in (500, 503, 401, 429):

        def failing(batch: TelemetryBatch, status: int = status) -> TelemetryBatchReceipt:
            raise ServiceRejected(status, "x", "try later")

        assert spool.drain(failing).stopped
        assert len(spool.pending()) == 1


def test_bounds_drop_the_oldest_and_count_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_batches=3)
    batches = [_batch(i) for i in range(5)]
    for batch in batches:
        spool.put(batch)
    assert spool.dropped == 2
    service = Service()
    spool.drain(service.send)
    assert service.stored == [b.batch_id for b in batches[2:]]


def test_a_spooled_file_that_is_no_batch_is_set_aside_and_the_rest_sent(tmp_path: Path) -> None:
    """A file an older agent wrote under laxer rules (here a count as a string), or a torn
    one, no longer stops the drain at every push: it is set aside with the reason."""
    spool = Spool(tmp_path)
    spool.put(_batch(0))
    spool.put(_batch(1))
    first = spool.pending()[0]
    first.write_text(first.read_text().replace('"read_ios":1000', '"read_ios":"1000"'))
    assert '"1000"' in first.read_text()
    spool = Spool(tmp_path)  # the agent that finds it: the files are all it has
    service = Service()
    result = spool.drain(service.send)
    assert (result.sent, result.rejected, result.windows) == (1, 1, 1)
    (reason,) = spool.rejected_dir.glob("*.reason")
    assert "read_ios" in reason.read_text()
    assert spool.pending() == []


def test_what_is_sent_from_memory_is_what_is_on_disk(tmp_path: Path) -> None:
    """The spool sends what this process spooled from memory (to spare the agent parsing it
    back), but only up to MEMO_BATCHES; the rest, and a restarted agent, read the files. Both
    routes send the same batches, in the same order."""
    count = MEMO_BATCHES + 5
    spool = Spool(tmp_path / "a")
    for index in range(count):
        spool.put(_batch(index))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    from_memory, from_disk = Service(), Service()
    sent: dict[str, list[TelemetryBatch]] = {"memory": [], "disk": []}

    def recorder(name: str, service: Service) -> Callable[[TelemetryBatch], TelemetryBatchReceipt]:
        def send(batch: TelemetryBatch) -> TelemetryBatchReceipt:
            sent[name].append(batch)
            return service.send(batch)

        return send

    assert spool.drain(recorder("memory", from_memory)).sent == count
    assert Spool(tmp_path / "b").drain(recorder("disk", from_disk)).sent == count
    assert sent["memory"] == sent["disk"]
    assert spool.pending() == []
    assert spool._memo == {}
