"""A bounded on-disk spool of telemetry batches, drained oldest first.

Every batch is written here (durably) before it is sent, so neither an outage of the service
nor a crash of the agent loses it. A batch leaves the spool only when the service has
acknowledged it (stored, or already stored: ingest is idempotent by batch id). A batch the
service refuses as invalid goes to rejected/ with the reason, not back into the queue. When
the bounds are reached the oldest batches are dropped, and counted."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from agent.contract.wire import TelemetryBatch, TelemetryBatchReceipt, TelemetryWindow
from agent.errors import ServiceRejected, ServiceUnreachable
from agent.fsutil import remove_durably, write_bytes_atomic

log = logging.getLogger(__name__)

RETRY_LATER = {401, 403, 408, 429}  # the service may take it later: keep it
OPEN_BATCH_WINDOWS = 64  # a batch grows by appends to this many windows at most
MEMO_BATCHES = 64  # batches kept in memory as well as on disk, so that draining them is cheap


@dataclass
class _OpenBatch:
    path: Path
    batch_id: uuid.UUID
    parts: list[bytes]  # each window's JSON
    windows: list[TelemetryWindow]


@dataclass
class DrainResult:
    sent: int = 0
    windows: int = 0  # in the batches sent (not the duplicates)
    duplicates: int = 0
    rejected: int = 0
    stopped: str = ""  # why draining stopped early, if it did


class Spool:
    def __init__(
        self, directory: Path, *, max_batches: int = 50_000, max_bytes: int = 256 << 20
    ) -> None:
        self.directory = directory
        self.rejected_dir = directory / "rejected"
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.dropped = 0
        # what this process spooled, so that sending it does not read and validate it again
        # (at 1 s windows that was a quarter of the agent's CPU); older batches come from disk
        self._memo: dict[Path, TelemetryBatch] = {}
        # the batch collections append to until the next drain (a batch spooled by an earlier
        # process is sealed: it may have been sent already)
        self._open: _OpenBatch | None = None
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        files = self.pending()
        self._next = int(files[-1].stem) + 1 if files else 1

    def pending(self) -> list[Path]:
        return sorted(self.directory.glob("[0-9]*.json"))

    def size_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.pending())

    def put(self, batch: TelemetryBatch) -> Path:
        """A batch of its own, sealed: sent as it is."""
        self._open = None
        return self._write(self._new_path(), batch, batch.model_dump_json().encode())

    def add(self, windows: Sequence[TelemetryWindow]) -> Path:
        """Windows collected now, durable at once: appended to the open batch — spooled since
        the last drain, so not yet offered to the service — while it has room for them
        (OPEN_BATCH_WINDOWS), else in a new open batch. A push then sends one request per
        push interval where it sent one per collection: 16 devices, 10 s windows and 30 s
        pushes make one request of 48 windows, not three of 16 (issue 35). Each window is
        serialised once; the file is rewritten whole (atomically) with the windows so far."""
        parts = [w.model_dump_json().encode() for w in windows]
        opened = self._open
        if opened is not None and len(opened.parts) + len(parts) <= OPEN_BATCH_WINDOWS:
            opened.parts.extend(parts)
            opened.windows.extend(windows)
        else:
            opened = self._open = _OpenBatch(self._new_path(), uuid.uuid4(), parts, list(windows))
        body = b'{"batch_id":"%s","windows":[%s]}' % (
            str(opened.batch_id).encode(),
            b",".join(opened.parts),
        )
        # the windows were validated when they were made: no second pass over them
        batch = TelemetryBatch.model_construct(
            batch_id=opened.batch_id, windows=list(opened.windows)
        )
        return self._write(opened.path, batch, body)

    def _new_path(self) -> Path:
        path = self.directory / f"{self._next:016d}.json"
        self._next += 1
        return path

    def _write(self, path: Path, batch: TelemetryBatch, body: bytes) -> Path:
        write_bytes_atomic(path, body)
        self._memo.pop(path, None)
        self._memo[path] = batch
        while len(self._memo) > MEMO_BATCHES:
            del self._memo[next(iter(self._memo))]
        self._enforce_bounds()
        return path

    def _enforce_bounds(self) -> None:
        files = self.pending()
        total = sum(path.stat().st_size for path in files)
        while files and (len(files) > self.max_batches or total > self.max_bytes):
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink()
            if self._open is not None and self._open.path == oldest:
                self._open = None  # not to be written again by the next append
            self._memo.pop(oldest, None)
            self.dropped += 1
            log.warning("spool full: dropped the oldest batch %s", oldest.name)

    def drain(self, send: Callable[[TelemetryBatch], TelemetryBatchReceipt]) -> DrainResult:
        self._open = None  # offered to the service from now on: never appended to again
        result = DrainResult()
        for path in self.pending():
            try:
                batch = self._memo.get(path) or self._load(path)
            except ValidationError as error:  # written by an agent with other rules
                self._reject(path, f"not a batch this agent can send: {error}")
                result.rejected += 1
                continue
            try:
                receipt = send(batch)
            except ServiceUnreachable as error:
                result.stopped = f"service unreachable: {error}"
                break
            except ServiceRejected as error:
                if error.status >= 500 or error.status in RETRY_LATER:
                    result.stopped = str(error)
                    break
                self._reject(path, str(error))
                result.rejected += 1
                log.error("service refused batch %s for good: %s", batch.batch_id, error)
                continue
            if receipt.accepted:
                result.sent += 1
                result.windows += len(batch.windows)
            else:
                result.duplicates += 1
            remove_durably(path)
            self._memo.pop(path, None)
        return result

    @staticmethod
    def _load(path: Path) -> TelemetryBatch:
        return TelemetryBatch.model_validate_json(path.read_bytes())

    def _reject(self, path: Path, reason: str) -> None:
        """Kept for an operator, out of the way of the batches still to send."""
        self._memo.pop(path, None)
        self.rejected_dir.mkdir(exist_ok=True)
        path.rename(self.rejected_dir / path.name)
        (self.rejected_dir / f"{path.stem}.reason").write_text(reason + "\n")
