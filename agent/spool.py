"""A bounded on-disk spool of telemetry batches, drained oldest first.

Every batch is written here (durably) before it is sent, so neither an outage of the service
nor a crash of the agent loses it. A batch leaves the spool only when the service has
acknowledged it (stored, or already stored: ingest is idempotent by batch id). A batch the
service refuses as invalid goes to rejected/ with the reason, not back into the queue. When
the bounds are reached the oldest batches are dropped, and counted."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from agent.contract.wire import TelemetryBatch, TelemetryBatchReceipt
from agent.errors import ServiceRejected, ServiceUnreachable
from agent.fsutil import remove_durably, write_bytes_atomic

log = logging.getLogger(__name__)

RETRY_LATER = {401, 403, 408, 429}  # the service may take it later: keep it
MEMO_BATCHES = 64  # batches kept in memory as well as on disk, so that draining them is cheap


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
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        files = self.pending()
        self._next = int(files[-1].stem) + 1 if files else 1

    def pending(self) -> list[Path]:
        return sorted(self.directory.glob("[0-9]*.json"))

    def size_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.pending())

    def put(self, batch: TelemetryBatch) -> Path:
        path = self.directory / f"{self._next:016d}.json"
        self._next += 1
        write_bytes_atomic(path, batch.model_dump_json().encode())
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
            self._memo.pop(oldest, None)
            self.dropped += 1
            log.warning("spool full: dropped the oldest batch %s", oldest.name)

    def drain(self, send: Callable[[TelemetryBatch], TelemetryBatchReceipt]) -> DrainResult:
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
