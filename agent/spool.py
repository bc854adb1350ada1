"""A bounded on-disk spool of telemetry batches, drained oldest first.

Every batch is written here (durably) before it is sent, so neither an outage of the service
nor a crash of the agent loses it. A batch leaves the spool only when the service has
acknowledged it (stored, or already stored: ingest is idempotent by batch id). A batch the
service refuses as invalid goes to rejected/ with the reason, not back into the queue — but one
it refuses as ending in its future (CLOCK_AHEAD: the node's clock is ahead) is held and sent
again, since it becomes acceptable as real time catches up. When
the bounds are reached the oldest batches are dropped, and counted.

Two kinds of file, named by a number that orders them: `N.json`, a sealed batch written whole
(atomically), and `N.jsonl`, the batch collections append to — a header line with its batch
id, then a line per collection (a JSON array of its windows), appended and fdatasync'd before
`add` returns.
Appending costs the agent one small write and one flush a collection, where rewriting the
batch whole cost a temporary file, two fsyncs and a rename (14 % of the agent's CPU at 1 s
windows, bench/results/agent_footprint.md). A crash while appending leaves at most a torn last
line, which `load` leaves out — the whole collection, whose `add` never returned; a failed
write is cut back off and the batch sealed (`_append`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import ValidationError

from agent.contract.base import CLOCK_AHEAD, MAX_CLOCK_SKEW
from agent.contract.wire import TelemetryBatch, TelemetryBatchReceipt, TelemetryWindow
from agent.errors import ServiceRejected, ServiceUnreachable
from agent.fsutil import fsync_dir, remove_durably, write_bytes_atomic

log = logging.getLogger(__name__)

RETRY_LATER = {401, 403, 408, 429}  # the service may take it later: keep it
OPEN_BATCH_WINDOWS = 64  # a batch grows by appends to this many windows at most
MEMO_BATCHES = 64  # batches kept in memory as well as on disk, so that draining them is cheap
SUFFIXES = {".json", ".jsonl"}  # a sealed batch's file, an open batch's


@dataclass
class _OpenBatch:
    path: Path
    batch_id: uuid.UUID
    fd: int  # opened for appending
    windows: list[TelemetryWindow]

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class DrainResult:
    sent: int = 0
    windows: int = 0  # in the batches sent (not the duplicates)
    duplicates: int = 0
    rejected: int = 0
    # batches the service refused because they end in its future (the node's clock is ahead):
    # kept, and offered again at the next drain
    held_for_clock: int = 0
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
        # every pending file and its size, oldest first: kept here, not listed and stat'ed at
        # every collection (an outage can leave tens of thousands of them)
        self._files: dict[Path, int] = {
            path: path.stat().st_size
            for path in sorted(
                self.directory.glob("[0-9]*.json*"), key=lambda p: (len(p.stem), p.stem)
            )
            if path.suffix in SUFFIXES and path.stem.isdigit()
        }
        self._next = int(next(reversed(self._files)).stem) + 1 if self._files else 1

    def pending(self) -> list[Path]:
        return list(self._files)

    def size_bytes(self) -> int:
        return sum(self._files.values())

    def put(self, batch: TelemetryBatch) -> Path:
        """A batch of its own, sealed: sent as it is."""
        self._seal()
        path = self._new_path(".json")
        write_bytes_atomic(path, batch.model_dump_json().encode())
        return self._written(path, path.stat().st_size, batch)

    def add(self, windows: Sequence[TelemetryWindow]) -> Path:
        """Windows collected now, durable at once: appended to the open batch — spooled since
        the last drain, so not yet offered to the service — while it has room for them
        (OPEN_BATCH_WINDOWS), else in a new open batch. A push then sends one request per
        push interval where it sent one per collection: 16 devices, 10 s windows and 30 s
        pushes make one request of 48 windows, not three of 16 (issue 35). Each window is
        serialised once; the collection is one line of the batch's file, all or nothing."""
        lines = b"[" + b",".join(w.model_dump_json().encode() for w in windows) + b"]\n"
        opened = self._open
        if opened is None or len(opened.windows) + len(windows) > OPEN_BATCH_WINDOWS:
            self._seal()
            batch_id = uuid.uuid4()
            path = self._new_path(".jsonl")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            opened = self._open = _OpenBatch(path, batch_id, fd, [])
            # the header and the first windows in one write: no file holds a header alone
            lines = json.dumps({"batch_id": str(batch_id)}).encode() + b"\n" + lines
            try:
                self._append(opened, lines)
            except BaseException:
                # nothing of it was kept (a full disk): no empty file is left for the next
                # drain to count as a rejected batch
                path.unlink(missing_ok=True)
                raise
            self._files[path] = 0  # pending from now on
            fsync_dir(self.directory)  # the new name is durable too
        else:
            self._append(opened, lines)
        opened.windows.extend(windows)
        # the windows were validated when they were made: no second pass over them
        batch = TelemetryBatch.model_construct(
            batch_id=opened.batch_id, windows=list(opened.windows)
        )
        return self._written(opened.path, self._files.get(opened.path, 0) + len(lines), batch)

    def _append(self, opened: _OpenBatch, data: bytes) -> None:
        """Appended and flushed. If that fails (a full disk, say), what was written of it is
        cut off again where that can be done, and the batch is sealed either way: the next
        collection never follows a torn line (`load` leaves one out at the end of a file, but
        would refuse the whole batch for one in its middle)."""
        size = os.fstat(opened.fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(opened.fd, view) :]
            os.fdatasync(opened.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(opened.fd, size)
            self._seal()
            raise

    def close(self) -> None:
        """Done with: the open batch is sealed (its file stays, to be sent)."""
        self._seal()

    def _seal(self) -> None:
        """The open batch is appended to no more."""
        if self._open is not None:
            self._open.close()
            self._open = None

    def _new_path(self, suffix: str) -> Path:
        path = self.directory / f"{self._next:016d}{suffix}"
        self._next += 1
        return path

    def _written(self, path: Path, size: int, batch: TelemetryBatch) -> Path:
        self._files[path] = size
        self._memo.pop(path, None)
        self._memo[path] = batch
        while len(self._memo) > MEMO_BATCHES:
            del self._memo[next(iter(self._memo))]
        self._enforce_bounds()
        return path

    def _forget(self, path: Path) -> None:
        if self._open is not None and self._open.path == path:
            self._seal()  # not to be written again by the next append
        self._files.pop(path, None)
        self._memo.pop(path, None)

    def _enforce_bounds(self) -> None:
        total = self.size_bytes()
        while self._files and (len(self._files) > self.max_batches or total > self.max_bytes):
            oldest, size = next(iter(self._files.items()))
            total -= size
            self._forget(oldest)
            oldest.unlink(missing_ok=True)
            self.dropped += 1
            log.warning("spool full: dropped the oldest batch %s", oldest.name)

    def drain(self, send: Callable[[TelemetryBatch], TelemetryBatchReceipt]) -> DrainResult:
        self._seal()  # offered to the service from now on: never appended to again
        result = DrainResult()
        for path in self.pending():
            if path not in self._memo and _empty(path):
                # an open batch whose first write never landed (an agent before 2026-12 left
                # one on a full disk): it held nothing, so nothing is rejected
                self._forget(path)
                path.unlink(missing_ok=True)
                continue
            try:
                batch = self._memo.get(path) or self.load(path)
            except (ValidationError, ValueError) as error:  # written by an agent with other rules
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
                if error.error == CLOCK_AHEAD and _worth_holding(batch):
                    result.held_for_clock += 1
                    self._hold_for_clock(batch, str(error))
                    if _made_with_this_clock(batch):
                        # the node's clock is ahead now: every later batch is too
                        result.stopped = f"held for the node's clock: {error}"
                        break
                    continue  # made while the clock was ahead, since set right: go on
                self._reject(path, str(error))
                result.rejected += 1
                log.error("service refused batch %s for good: %s", batch.batch_id, error)
                continue
            if receipt.accepted:
                result.sent += 1
                result.windows += len(batch.windows)
            else:
                result.duplicates += 1
            self._forget(path)
            remove_durably(path)
        if not result.held_for_clock and not result.stopped:
            self.clock_file.unlink(missing_ok=True)
        return result

    @property
    def clock_file(self) -> Path:
        """Written while batches are held because the service finds them in its future: what
        `blkpilot agent status` reads."""
        return self.directory / "clock-ahead.json"

    def clock_hold(self) -> dict[str, str] | None:
        try:
            found = json.loads(self.clock_file.read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def _hold_for_clock(self, batch: TelemetryBatch, why: str) -> None:
        latest = max(w.end for w in batch.windows)
        with contextlib.suppress(OSError):  # a full disk: the metric and the log still say it
            write_bytes_atomic(
                self.clock_file,
                json.dumps(
                    {"since": _now().isoformat(), "batch_ends": latest.isoformat(), "why": why}
                ).encode(),
            )
        log.warning(
            "batch %s held: the service finds it in its future (the node's clock is ahead?);"
            " it is sent again as real time catches up: %s",
            batch.batch_id,
            why,
        )

    @staticmethod
    def load(path: Path) -> TelemetryBatch:
        """The batch a spooled file holds, of either kind (a torn last line of an open batch's
        file is left out: the collection that wrote it was never acknowledged as spooled)."""
        data = path.read_bytes()
        if path.suffix == ".json":
            return TelemetryBatch.model_validate_json(data)
        lines = data.split(b"\n")
        if not data.endswith(b"\n"):
            lines.pop()  # torn
        if not lines or not lines[0]:
            raise ValueError("an open batch's file without its header line")
        try:
            header = json.loads(lines[0])
        except ValueError as error:
            raise ValueError(f"an open batch's header is not JSON: {error}") from error
        if not isinstance(header, dict) or not isinstance(header.get("batch_id"), str):
            raise ValueError("an open batch's header has no batch_id")
        collections = [line for line in lines[1:] if line]
        if any(not (line.startswith(b"[") and line.endswith(b"]")) for line in collections):
            raise ValueError("an open batch's line is not a collection (a JSON array)")
        body = b'{"batch_id":%s,"windows":[%s]}' % (
            json.dumps(header["batch_id"]).encode(),
            b",".join(line[1:-1] for line in collections if line != b"[]"),
        )
        return TelemetryBatch.model_validate_json(body)

    def _reject(self, path: Path, reason: str) -> None:
        """Kept for an operator, out of the way of the batches still to send."""
        self._forget(path)
        self.rejected_dir.mkdir(exist_ok=True)
        path.rename(self.rejected_dir / path.name)
        (self.rejected_dir / f"{path.stem}.reason").write_text(reason + "\n")


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except FileNotFoundError:
        return True


# a batch refused as "in the future" is held at most this far ahead of the node's own clock:
# beyond, it was made while the clock was far off, and would wait that long
MAX_HOLD_AHEAD = timedelta(days=1)


def _now() -> datetime:
    return datetime.now(UTC)


def _worth_holding(batch: TelemetryBatch) -> bool:
    return bool(batch.windows) and max(w.end for w in batch.windows) <= _now() + MAX_HOLD_AHEAD


def _made_with_this_clock(batch: TelemetryBatch) -> bool:
    """Whether the batch is "now" by the node's own clock (so the clock itself is ahead of
    the service's), rather than dated past it (made before the clock was set back)."""
    return max(w.end for w in batch.windows) <= _now() + MAX_CLOCK_SKEW
