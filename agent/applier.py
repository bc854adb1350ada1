"""Applying a device configuration through sysfs, safely.

Only attributes on the allow-list (agent.contract.tunables), only values in range, only below
the device's own queue directory. Before writing: a snapshot, recorded in an fsync'd journal.
Each write is read back. Any refusal or mismatch restores the snapshot at once; a crash
mid-change leaves the journal behind and `recover()` (run when the agent starts) restores it.
The last snapshot per device is kept for `rollback`, and the applied values for drift detection.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from agent.contract.tunables import (
    JIFFY_TUNABLES,
    QUEUE_LIMITS,
    SCHEDULER_TUNABLES,
    CompletionMode,
    DeviceConfig,
    Scheduler,
    jiffy_readbacks,
)
from agent.discovery import KernelFacts, parse_scheduler
from agent.effects import Effects, SysfsWriteError
from agent.errors import AgentError, ChangeFailed, ChangeRefused, NoSnapshot
from agent.fsutil import read_json, remove_durably, write_json_atomic
from agent.host import HostPaths, read_text

log = logging.getLogger(__name__)

_DEVICE = re.compile(r"^[a-z][a-z0-9_.:!-]{0,63}$")
_TUNABLE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

Values = dict[str, str]  # attribute below queue/ ("scheduler", "iosched/slice_idle_us") -> value


class _ReadBackMismatch(Exception):
    """The kernel kept a different value than the one written."""


@dataclass(frozen=True)
class Drift:
    attribute: str
    expected: str
    actual: str | None


@dataclass(frozen=True)
class ApplyResult:
    device: str
    txid: str
    before: Values
    after: Values


def plan(config: DeviceConfig, kernel: KernelFacts, current_scheduler: str | None) -> Values:
    """The writes a configuration needs, in the order they must happen. Refuses what the
    allow-list, the ranges or the kernel do not permit — before anything is written."""
    try:  # re-check even a config built without validation (model_construct)
        config = DeviceConfig.model_validate(config.model_dump())
    except ValidationError as error:
        raise ChangeRefused(f"configuration refused: {error}") from error
    writes: Values = {}
    scheduler = config.scheduler.value if config.scheduler else current_scheduler
    if config.scheduler is not None:
        writes["scheduler"] = config.scheduler.value
    # A scheduler switch resets nr_requests, so it comes after; tunables belong to the new one.
    for name in ("nr_requests", "read_ahead_kb"):
        value = getattr(config, name)
        if value is not None:
            writes[name] = str(value)
    if config.scheduler_tunables:
        allowed = SCHEDULER_TUNABLES.get(Scheduler(scheduler)) if scheduler else None
        for name, value in sorted(config.scheduler_tunables.items()):
            if allowed is None or name not in allowed or not _TUNABLE.match(name):
                raise ChangeRefused(f"{name!r} is not an allowed tunable of {scheduler}")
            writes[f"iosched/{name}"] = str(value)
    if config.completion is not None:
        writes.update(_completion_writes(config.completion, kernel))
    return writes


def _completion_writes(mode: CompletionMode, kernel: KernelFacts) -> Values:
    if mode is CompletionMode.HYBRID_POLL and not kernel.hybrid_polling:
        raise ChangeRefused(f"hybrid polling was removed in Linux 6.4 (this is {kernel.release})")
    writes: Values = {}
    if mode is CompletionMode.INTERRUPT:
        if kernel.io_poll_writable:  # since 5.16 polling is only what the application asks for
            writes["io_poll"] = "0"
        return writes
    # Since 5.16 the kernel ignores this write but still checks it: EINVAL if the queue
    # cannot poll (no poll queues) — which is exactly what a polling policy must learn.
    writes["io_poll"] = "1"
    if kernel.hybrid_polling:
        writes["io_poll_delay"] = "0" if mode is CompletionMode.HYBRID_POLL else "-1"
    return writes


class Applier:
    def __init__(self, paths: HostPaths, state_dir: Path, effects: Effects | None = None) -> None:
        self.paths = paths
        self.state_dir = state_dir
        self.effects = effects or Effects()
        self.kernel = KernelFacts.of(paths)

    # --- paths -----------------------------------------------------------------------------

    def _queue(self, device: str) -> Path:
        if not _DEVICE.match(device):
            raise ChangeRefused(f"{device!r} is not a block device name")
        queue = self.paths.queue(device)
        if not (queue / "scheduler").exists():
            raise ChangeRefused(f"{device} has no request queue under {self.paths.block}")
        return queue

    def _attribute(self, device: str, attribute: str) -> Path:
        """The file for an allowed attribute, proven to lie inside the device's queue/."""
        name = attribute.removeprefix("iosched/")
        on_list = (
            attribute in ("scheduler", "io_poll") or attribute in QUEUE_LIMITS
            if "/" not in attribute
            else attribute.startswith("iosched/") and _TUNABLE.match(name) is not None
        )
        if not on_list:
            raise ChangeRefused(f"{attribute!r} is not on the allow-list")
        queue = self._queue(device)
        path = queue / attribute
        real_queue = os.path.realpath(queue)
        if os.path.commonpath([os.path.realpath(path), real_queue]) != real_queue:
            raise ChangeRefused(f"{attribute!r} leaves {device}'s queue directory")
        return path

    def read(self, device: str, attribute: str) -> str | None:
        text = read_text(self._attribute(device, attribute))
        if text is not None and attribute == "scheduler":
            return parse_scheduler(text)[1]
        return text

    def current(self, device: str) -> DeviceConfig:
        """The device's configuration now, as a configuration blkpilot could apply: the
        scheduler, those of its tunables on the allow-list (in range), the queue limits.
        What a rollout captures before it changes a device, to put it back exactly."""
        scheduler = self.read(device, "scheduler")
        known = {s.value: s for s in Scheduler}
        chosen = known.get(scheduler or "")
        tunables: dict[str, int] = {}
        iosched = self._queue(device) / "iosched"
        for name, (low, high) in SCHEDULER_TUNABLES.get(chosen, {}).items() if chosen else ():
            text = read_text(iosched / name)
            if text is not None and text.lstrip("-").isdigit() and low <= int(text) <= high:
                tunables[name] = int(text)
        if "slice_idle_us" in tunables:  # the same setting twice; the finer one is enough
            tunables.pop("slice_idle", None)
        limits: dict[str, int] = {}
        for name in ("nr_requests", "read_ahead_kb"):
            text = self.read(device, name)
            low, high = QUEUE_LIMITS[name]
            if text is not None and text.isdigit() and low <= int(text) <= high:
                limits[name] = int(text)
        return DeviceConfig(scheduler=chosen, scheduler_tunables=tunables, **limits)

    @contextmanager
    def device_lock(
        self, device: str, on_wait: Callable[[str], None] | None = None
    ) -> Iterator[None]:
        """The device, for one process on the host at a time (a canary, a sweep, an apply):
        a second one waits — saying so, and for whom, through `on_wait` (default: the log) —
        instead of interleaving with the first, whatever state directory either uses. Once
        held, a change to the device that a crash or kill -9 interrupted is undone first, so
        that nothing takes a killed canary's candidate for the device's own configuration."""
        path = self._lock_file(device)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
                (on_wait or log.warning)(f"waiting for {device}: it is held by {holder}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, _holder().encode(), 0)
            try:
                self._recover_device(device)
                yield
            finally:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _recover_device(self, device: str) -> None:
        """With the device's lock held: an interrupted change (the journal) undone, and a
        killed canary's candidate on this device put back to the canary's baseline."""
        with self._exclusive():
            self._recover_locked()
        marker = self._canary_marker(device)
        if marker.exists():
            self._recover_canary(marker)

    @contextmanager
    def canary(self, device: str) -> Iterator[str | None]:
        """A canary under way on the device: its lock, and a marker naming what the device
        had applied when it began (yielded: `restore_canary_baseline` takes it). A canary
        ended by a signal restores its baseline itself (agent.signals); one ended by kill -9
        leaves the marker, and `recover()` at the agent's next start puts the baseline back."""
        with self.device_lock(device):
            marker = self._canary_marker(device)
            marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_json_atomic(
                marker,
                {
                    "device": device,
                    "baseline_txid": self._applied_txid(device),
                    "started_at": datetime.now(UTC).isoformat(),
                },
            )
            try:
                yield self._applied_txid(device)
            finally:
                remove_durably(marker)

    def restore_canary_baseline(self, device: str, baseline_txid: str | None) -> bool:
        """Put back the configuration a canary began from: where the change recorded as
        applied is not the one it began from, that change is rolled back. True if it was."""
        if self._applied_txid(device) in (None, baseline_txid):
            return False
        self.rollback(device)
        return True

    def _canary_marker(self, device: str) -> Path:
        return self.state_dir / "canaries" / f"{device}.json"

    def _applied_txid(self, device: str) -> str | None:
        path = self._applied_file(device)
        return str(read_json(path).get("txid")) if path.exists() else None

    def _recover_canaries(self) -> list[str]:
        """Canaries a kill -9 ended: where the candidate is still applied (the applied
        change is not the one the canary began from), the baseline is restored."""
        restored = []
        folder = self.state_dir / "canaries"
        for marker in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                alive = self.busy(marker.stem)
            except AgentError:  # not a device's name, or a device gone: nothing holds it
                alive = False
            if alive:
                continue  # that canary is alive (it holds the device's lock)
            if self._recover_canary(marker):
                restored.append(marker.stem)
        return restored

    def _recover_canary(self, marker: Path) -> bool:
        """One killed canary's marker: its baseline restored where its candidate is still
        applied (True), and the marker gone."""
        try:
            entry = read_json(marker)
            device = str(entry["device"])
            baseline = entry.get("baseline_txid")
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as error:
            log.error("canary marker %s unreadable (%s): set aside", marker.name, error)
            os.replace(marker, marker.with_suffix(".unreadable"))
            return False
        if self.effects.dry_run:
            log.warning("dry run: the canary interrupted on %s would be undone", device)
            return False
        restored = False
        try:
            if self.restore_canary_baseline(device, baseline):
                restored = True
                log.warning("a canary on %s was killed: its baseline is restored", device)
        except (AgentError, OSError, ValueError) as error:
            self._hold(device, f"a killed canary's baseline could not be restored: {error}")
        remove_durably(marker)
        return restored

    def busy(self, device: str) -> bool:
        """Whether a canary, a sweep or an apply holds the device now (without waiting)."""
        fd = os.open(self._lock_file(device), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    def _lock_file(self, device: str) -> Path:
        self._queue(device)  # a device's name, not a path
        self.paths.locks.mkdir(parents=True, exist_ok=True, mode=0o755)
        return self.paths.locks / f"{device}.lock"

    # --- snapshots and the journal -----------------------------------------------------------

    def snapshot(self, device: str, attributes: list[str]) -> Values:
        """Current values of what will change, plus the current scheduler and its tunables
        (a scheduler switch loses them)."""
        values: Values = {}
        current = self.read(device, "scheduler")
        if current:
            values["scheduler"] = current
            iosched = self._queue(device) / "iosched"
            if iosched.is_dir():
                for entry in sorted(iosched.iterdir()):
                    text = read_text(entry)
                    if text is not None and _TUNABLE.match(entry.name):
                        values[f"iosched/{entry.name}"] = text
        for attribute in ("nr_requests", "read_ahead_kb", *attributes):
            if attribute not in values and not attribute.startswith("iosched/"):
                value = self.read(device, attribute)
                if value is not None:
                    values[attribute] = value
        return values

    @property
    def _journal(self) -> Path:
        return self.state_dir / "journal.json"

    def _snapshot_file(self, device: str) -> Path:
        return self.state_dir / "snapshots" / f"{device}.json"

    def _applied_file(self, device: str) -> Path:
        return self.state_dir / "applied" / f"{device}.json"

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One change at a time on this node, whether from the daemon or the command line."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.paths.locks.mkdir(parents=True, exist_ok=True, mode=0o755)
        with (self.paths.locks / "apply.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # --- changing things ---------------------------------------------------------------------

    def apply(self, device: str, config: DeviceConfig) -> ApplyResult:
        writes = plan(config, self.kernel, self.read(device, "scheduler"))
        if not writes:
            raise ChangeRefused("the configuration asks for no change")
        for attribute in writes:
            self._attribute(device, attribute)  # refuse before snapshotting anything
        self._refuse_held(device)
        if self.effects.dry_run:
            return self._dry_apply(device, writes)
        with self._exclusive():
            self._recover_locked()
            txid = uuid.uuid4().hex
            before = self.snapshot(device, list(writes))
            write_json_atomic(
                self._journal,
                {
                    "txid": txid,
                    "device": device,
                    "snapshot": before,
                    "writes": writes,
                    "started_at": datetime.now(UTC).isoformat(),
                },
            )
            try:
                self._write_all(device, writes)
            except (SysfsWriteError, _ReadBackMismatch) as error:
                restored = self._restore_or_hold(device, before, f"apply failed: {error}")
                raise ChangeFailed(f"{device}: {error}", restored=restored) from error
            except BaseException as error:  # a signal (agent.signals.Interrupted), a bug
                self._restore_or_hold(device, before, f"apply interrupted: {error!r}")
                raise
            try:
                write_json_atomic(self._snapshot_file(device), {"txid": txid, "values": before})
                write_json_atomic(self._applied_file(device), {"txid": txid, "values": writes})
                remove_durably(self._journal)
            except BaseException as error:
                # written, not yet recorded: undone, so that the device and blkpilot's records
                # of it agree (a canary restores by what is recorded)
                self._restore_or_hold(device, before, f"apply interrupted: {error!r}")
                for record in (self._snapshot_file(device), self._applied_file(device)):
                    if record.exists() and read_json(record).get("txid") == txid:
                        remove_durably(record)
                raise
        log.info("applied %s to %s (tx %s)", writes, device, txid)
        return ApplyResult(device, txid, before, writes)

    def _write_all(self, device: str, writes: Values) -> None:
        """Each write in order, read back. A value already in place is not written again:
        writing the scheduler freezes the queue even to the same one, and a canary's arms must
        cost the same (its rollback skips equal values too). io_poll is always written — the
        kernel checks it even where it ignores it, and that check is what polling must learn."""
        for attribute, value in writes.items():
            if attribute != "io_poll" and self.read(device, attribute) == value:
                continue
            self.effects.write_attribute(self._attribute(device, attribute), value)
            if self.effects.dry_run:
                continue
            actual = self.read(device, attribute)
            if attribute == "io_poll" and not self.kernel.io_poll_writable:
                continue  # ignored by the kernel since 5.16: nothing to read back
            if actual != value and self._rounded_to_a_tick(device, attribute, value, actual):
                log.info("%s: %s=%s reads back %s (jiffies)", device, attribute, value, actual)
                writes[attribute] = str(actual)  # what the device holds, for drift
                continue
            if actual != value:
                raise _ReadBackMismatch(f"read-back of {attribute} gave {actual!r}, not {value!r}")

    def _rounded_to_a_tick(
        self, device: str, attribute: str, value: str, actual: str | None
    ) -> bool:
        """Whether a read-back differs only by the kernel's rounding to a jiffy."""
        scheduler = parse_scheduler(read_text(self._queue(device) / "scheduler") or "")[1]
        name = attribute.removeprefix("iosched/")
        jiffies = JIFFY_TUNABLES.get(Scheduler(scheduler)) if scheduler in set(Scheduler) else None
        if not jiffies or name not in jiffies or actual is None:
            return False
        try:
            return int(actual) in jiffy_readbacks(int(value), self.kernel.hz)
        except ValueError:
            return False

    def _restore(self, device: str, values: Values) -> bool:
        """Scheduler first (switching resets the rest), then its tunables, then the queue."""
        ok = True
        order = sorted(values, key=lambda a: (a != "scheduler", a.startswith("io_poll"), a))
        for attribute in order:
            if attribute == "io_poll" and not self.kernel.io_poll_writable:
                continue
            try:
                if self.read(device, attribute) != values[attribute]:
                    self.effects.write_attribute(
                        self._attribute(device, attribute), values[attribute]
                    )
            except (OSError, ChangeRefused) as error:
                log.error("restoring %s on %s failed: %s", attribute, device, error)
                ok = False
        return ok

    def recover(self) -> str | None:
        """Undo a change a crash interrupted, then any canary a kill -9 ended; returns a
        device it restored, if any."""
        with self._exclusive():
            found = self._recover_locked()
        canaries = self._recover_canaries()
        return found or (canaries[0] if canaries else None)

    def _recover_locked(self) -> str | None:
        if not self._journal.exists():
            return None
        try:
            entry = read_json(self._journal)
            device = str(entry["device"])
            snapshot = {str(k): str(v) for k, v in dict(entry["snapshot"]).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return self._set_aside_journal(error)
        if self.effects.dry_run:  # a dry run changes nothing, the journal included
            log.warning(
                "dry run: an interrupted change %s on %s would be undone (journal kept)",
                entry.get("txid"),
                device,
            )
            return None
        restored = self._restore_or_hold(
            device, snapshot, f"recovering interrupted change {entry.get('txid')}"
        )
        log.warning(
            "recovered interrupted change %s on %s: snapshot %s",
            entry.get("txid"),
            device,
            "restored" if restored else "NOT fully restored (journal kept, device held)",
        )
        return device

    def _restore_or_hold(self, device: str, snapshot: Values, why: str) -> bool:
        """Restore the journaled snapshot. Restored: the journal goes. Not: the journal is
        kept beside (it is what an operator needs to finish the restore) and the device is
        held until released — blkpilot never changes a device it could not put back."""
        restored = self._restore(device, snapshot)
        if restored:
            remove_durably(self._journal)
            return True
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        kept = self._journal.with_name(f"journal.unrestored-{device}-{stamp}.json")
        os.replace(self._journal, kept)
        self._hold(
            device,
            f"{why}: the snapshot could not be fully restored; the journal is kept as {kept.name}",
        )
        return False

    def rollback(self, device: str) -> Values:
        """Restore the snapshot taken before the last change applied to the device."""
        self._queue(device)
        path = self._snapshot_file(device)
        if not path.exists():
            raise NoSnapshot(f"no snapshot for {device}: nothing was applied to it by blkpilot")
        snapshot: Values = dict(read_json(path)["values"])
        with self._exclusive():
            if not self._restore(device, snapshot):
                raise ChangeFailed(f"{device}: rollback incomplete", restored=False)
            if not self.effects.dry_run:
                remove_durably(path)
                remove_durably(self._applied_file(device))
        return snapshot

    def _dry_apply(self, device: str, writes: Values) -> ApplyResult:
        """What apply would do, with nothing changed: no recovery, no journal, no records."""
        if self._journal.exists():
            log.warning("dry run: a pending journal would be recovered first (kept)")
        before = self.snapshot(device, list(writes))
        for attribute, value in writes.items():
            self.effects.write_attribute(self._attribute(device, attribute), value)
        return ApplyResult(device, "dry-run", before, writes)

    # --- a journal that cannot be read ------------------------------------------------------

    def _hold_file(self) -> Path:
        return self.state_dir / "held.json"

    def held(self) -> dict[str, str]:
        """Devices blkpilot will not change until an operator releases them: name (or "*",
        every device, when the journal did not say which) -> why.

        A hold file that cannot be read is treated as an unreadable journal is: set aside for
        an operator, and every device held (which ones it held is unknown)."""
        path = self._hold_file()
        if not path.exists():
            return {}
        try:
            found = read_json(path)
            if not isinstance(found, dict):
                raise ValueError(f"a JSON object was expected, not {type(found).__name__}")
            return {str(k): str(v) for k, v in found.items()}
        except (ValueError, OSError) as error:
            return self._set_aside_holds(error)

    def _set_aside_holds(self, error: Exception) -> dict[str, str]:
        path = self._hold_file()
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = path.with_name(f"held.unreadable-{stamp}.json")
        reason = (
            f"the list of held devices could not be read ({error}); set aside as {aside.name}:"
            " every device is held until an operator has looked"
        )
        if self.effects.dry_run:
            log.error("dry run: %s (nothing moved)", reason)
            return {"*": reason}
        os.replace(path, aside)
        held = {"*": reason}
        write_json_atomic(path, held)
        log.error(
            "UNREADABLE HOLD LIST: %s; release with `blkpilot agent release '*'`"
            " once it is checked",
            reason,
        )
        return held

    def _hold(self, device: str, reason: str) -> None:
        held = self.held()
        held[device] = reason
        write_json_atomic(self._hold_file(), held)
        log.error("%s held: %s; check it, then `blkpilot agent release %s`", device, reason, device)

    def _refuse_held(self, device: str) -> None:
        held = self.held()
        reason = held.get(device) or held.get("*")
        if reason is not None:
            raise ChangeRefused(
                f"{device} is held: {reason}; check it, then `blkpilot agent release {device}`"
            )

    def release(self, device: str) -> bool:
        """An operator has looked: blkpilot may change the device again."""
        with self._exclusive():
            held = self.held()
            if device not in held:
                return False
            del held[device]
            if held:
                write_json_atomic(self._hold_file(), held)
            else:
                remove_durably(self._hold_file())
        log.warning("released %s: blkpilot may change it again", device)
        return True

    def _set_aside_journal(self, error: Exception) -> str | None:
        """A journal that cannot be read (truncated, edited) cannot be trusted to restore
        anything. It is moved aside for an operator, and the device it names — every device,
        if even that cannot be read — is held: never changed until released. The agent
        itself goes on (collection needs no journal)."""
        raw = self._journal.read_bytes()[:4096].decode("utf-8", "replace")
        named = re.search(r'"device"\s*:\s*"([^"]{1,64})"', raw)
        device = named.group(1) if named and _DEVICE.match(named.group(1)) else "*"
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = self._journal.with_name(f"journal.unreadable-{stamp}.json")
        reason = f"the change journal could not be read ({error}); set aside as {aside.name}"
        if self.effects.dry_run:
            log.error("dry run: %s would be done; %s", reason, "journal kept")
            return None
        os.replace(self._journal, aside)
        held = self.held()
        held[device] = reason
        write_json_atomic(self._hold_file(), held)
        log.error(
            "UNREADABLE JOURNAL: %s; %s held until an operator checks it and runs"
            " `blkpilot agent release %s`",
            reason,
            "every device" if device == "*" else device,
            device,
        )
        return None

    def applied(self, device: str) -> Values | None:
        path = self._applied_file(device)
        return dict(read_json(path)["values"]) if path.exists() else None

    def drift(self, device: str) -> list[Drift]:
        """Applied values something else has since changed (udev rules, TuneD, an admin)."""
        expected = self.applied(device)
        if not expected:
            return []
        found = []
        for attribute, value in expected.items():
            if attribute == "io_poll" and not self.kernel.io_poll_writable:
                continue
            actual = self.read(device, attribute)
            if actual != value:
                found.append(Drift(attribute, value, actual))
        return found


def _holder() -> str:
    """Who holds a lock, as a waiting process reads it: pid, command and since when."""
    command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv[:4]))
    return f"pid {os.getpid()} ({command}) since {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"
