from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

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


def _windows(device_count: int, index: int) -> list[TelemetryWindow]:
    return [
        TelemetryWindow.model_validate(telemetry_window(f"loop{d}", index=index))
        for d in range(device_count)
    ]


def test_collections_between_two_pushes_make_one_batch(tmp_path: Path) -> None:
    """16 devices, three collections before a push: one request of 48 windows, not three of
    16 (at 10,000 nodes that is 333 requests a second instead of 1,000) — each collection on
    disk the moment it is made."""
    spool = Spool(tmp_path)
    for index in range(3):
        spool.add(_windows(16, index))
        (path,) = spool.pending()  # durable at once, in the one open batch
        on_disk = Spool.load(path)
        assert len(on_disk.windows) == 16 * (index + 1)
    service = Service()
    assert spool.drain(service.send).sent == 1
    assert len(service.stored) == 1
    # a drain seals what it offered: the next collection opens a batch of its own
    spool.add(_windows(16, 3))
    spool.add(_windows(16, 4))
    (path,) = spool.pending()
    reopened = Spool.load(path)
    assert reopened.batch_id not in service.stored
    assert [w.start for w in reopened.windows[::16]] == [
        w.start for w in _windows(1, 3) + _windows(1, 4)
    ]


def test_an_open_batch_is_sealed_when_full_and_by_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for index in range(5):  # 5 x 16 windows: the open batch holds 64 at most
        spool.add(_windows(16, index))
    assert [len(Spool.load(p).windows) for p in spool.pending()] == [64, 16]
    # an agent that starts again never appends to what an earlier one spooled (it may have
    # been sent, and a batch id names one content)
    again = Spool(tmp_path)
    again.add(_windows(16, 5))
    assert [len(Spool.load(p).windows) for p in again.pending()] == [64, 16, 16]
    # what is sent from memory is what is on disk
    sent: list[TelemetryBatch] = []

    def send(batch: TelemetryBatch) -> TelemetryBatchReceipt:
        sent.append(batch)
        return TelemetryBatchReceipt(
            batch_id=batch.batch_id, accepted=True, windows=len(batch.windows)
        )

    on_disk = [Spool.load(p) for p in again.pending()]
    again.drain(send)
    assert [b.model_dump() for b in sent] == [b.model_dump() for b in on_disk]


def test_a_collection_is_appended_not_the_batch_rewritten(tmp_path: Path) -> None:
    """The open batch's file grows by one line a collection (the same file, not a new one
    renamed over it each collection), and a crash in the middle of an append — a torn last
    line — costs only the collection whose `add` never returned, whole."""
    spool = Spool(tmp_path)
    spool.add(_windows(16, 0))
    (path,) = spool.pending()
    assert path.suffix == ".jsonl"
    inode, size = path.stat().st_ino, path.stat().st_size
    spool.add(_windows(16, 1))
    assert path.stat().st_ino == inode
    assert path.stat().st_size > size
    assert len(path.read_bytes().splitlines()) == 1 + 2  # the header, a line a collection
    assert spool.size_bytes() == path.stat().st_size
    with path.open("ab") as handle:  # a crash in the middle of the next collection's write
        whole = b"[" + b",".join(w.model_dump_json().encode() for w in _windows(16, 2)) + b"]"
        handle.write(whole[: len(whole) * 2 // 3])  # ten windows' worth, and a torn one
    restarted = Spool(tmp_path)
    service = Service()
    sent: list[TelemetryBatch] = []

    def send(batch: TelemetryBatch) -> TelemetryBatchReceipt:
        sent.append(batch)
        return service.send(batch)

    result = restarted.drain(send)
    assert (result.sent, result.rejected) == (1, 0)
    assert len(sent[0].windows) == 32
    assert restarted.pending() == []
    assert not path.exists()


def test_an_open_batch_without_its_header_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / "0000000000000001.jsonl").write_bytes(b'{"batch_')  # torn at its creation
    spool = Spool(tmp_path)
    spool.put(_batch(0))
    result = spool.drain(Service().send)
    assert (result.sent, result.rejected) == (1, 1)
    (reason,) = spool.rejected_dir.glob("*.reason")
    assert "header" in reason.read_text()


def test_a_failed_append_seals_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails half-way (a full disk): what it wrote is cut off again and the batch
    sealed, so the next collection goes to a batch of its own, and both are sent — the
    collection whose `add` raised left out whole (the runner spools it again)."""
    spool = Spool(tmp_path)
    spool.add(_windows(16, 0))
    real_write = os.write

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        spool.add(_windows(16, 1))
    monkeypatch.setattr(os, "write", real_write)
    spool.add(_windows(16, 2))
    assert len(spool.pending()) == 2
    sent: list[TelemetryBatch] = []

    def send(batch: TelemetryBatch) -> TelemetryBatchReceipt:
        sent.append(batch)
        return TelemetryBatchReceipt(batch_id=batch.batch_id, accepted=True, windows=1)

    result = Spool(tmp_path).drain(send)  # as a restarted agent reads them
    assert (result.sent, result.rejected) == (2, 0)
    assert [len(b.windows) for b in sent] == [16, 16]
