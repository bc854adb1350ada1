"""The agent's loop: collect telemetry windows, spool and send them, keep the service's view of
the node's devices current, apply desired policies and report what happened, notice drift."""

from __future__ import annotations

import dataclasses
import logging
import platform
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent import calibrate
from agent.applier import Applier, Drift
from agent.bench.target import device_target
from agent.collectors import CollectorSet, collectors_for, is_power_source
from agent.collectors.blklat import BlkLatCollector, LatencySnapshot
from agent.collectors.diskstats import DiskStats
from agent.config import AgentConfig
from agent.contract import __version__
from agent.contract.base import CLOCK_AHEAD, MAX_WINDOWS_PER_BATCH
from agent.contract.owned import owned_by
from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.wire import (
    AppliedStateReport,
    AppliedStatus,
    Heartbeat,
    InventoryReport,
    OwnerPolicy,
    TelemetryBatch,
    TelemetryWindow,
)
from agent.discovery import Discovery, discover, queue_configuration
from agent.effects import Effects
from agent.errors import (
    AgentError,
    ChangeFailed,
    ChangeRefused,
    ServiceError,
    ServiceRejected,
    ServiceUnreachable,
)
from agent.fsutil import read_json, write_json_atomic
from agent.owners import owners
from agent.power import PowerSample
from agent.spool import RETRY_LATER, DrainResult, Spool
from agent.state import NodeState, PausedPolicies
from agent.telemetry import Collection, NodeWindow, windows
from agent.uevents import Uevents

log = logging.getLogger(__name__)
# windows kept in memory while the spool cannot be written (16 devices at 10 s windows: 2 h)
MAX_UNSPOOLED = 12_000
RENEW_RETRY_S = 60.0


@dataclass(frozen=True)
class AgentView:
    """What the exporter shows: replaced whole after each step, never mutated."""

    discovery: Discovery | None = None
    disks: dict[str, DiskStats] = field(default_factory=dict)
    latest: dict[str, TelemetryWindow] = field(default_factory=dict)
    power: list[PowerSample] = field(default_factory=list)
    node: NodeWindow | None = None
    energy_totals: dict[tuple[str, str, str], float] = field(default_factory=dict)
    drift: dict[str, list[Drift]] = field(default_factory=dict)
    context_switches: int | None = None
    spool_batches: int = 0
    spool_bytes: int = 0
    last_push_ok: float | None = None
    latency: LatencySnapshot | None = None  # cumulative, from eBPF
    # this node's clock less the service's (s, from its answers' Date); batches held for it
    clock_offset_s: float | None = None
    clock_hold: bool = False


@dataclass
class Counters:
    windows_collected: int = 0
    spool_dropped: int = 0
    spool_rejected: int = 0
    windows_sent: int = 0
    token_renewals: int = 0
    applies: dict[str, int] = field(
        default_factory=lambda: {
            "applied": 0,
            "failed": 0,
            "yielded": 0,
            "taken_over": 0,
            "hotplug": 0,
        }
    )
    drift_reports: int = 0
    spool_write_failures: int = 0
    windows_unspooled_dropped: int = 0
    batches_held_for_clock: int = 0
    # the loop's actions (collect, push, policy, inventory) that raised: each is tried again
    # at its next turn, the others go on
    action_failures: dict[str, int] = field(default_factory=dict)


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        state: NodeState | None,
        state_dir: Path,
        *,
        effects: Effects | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.state_dir = state_dir
        self.paths = config.paths
        self.effects = effects or Effects(dry_run=config.dry_run)
        self.applier = Applier(self.paths, state_dir, self.effects)
        self.calibrations = calibrate.CalibrationStore(state_dir)
        self.spool = Spool(
            state_dir / "spool",
            max_batches=config.spool_max_batches,
            max_bytes=config.spool_max_bytes,
        )
        self.collectors = CollectorSet(collectors_for(config))
        self.power_sources = {c.name for c in self.collectors.collectors if is_power_source(c)}
        # why there is no per-I/O latency here ("": there is), for /metrics
        blklat = next((c for c in self.collectors.collectors if c.name == "blklat"), None)
        self.blklat = blklat if isinstance(blklat, BlkLatCollector) else None
        self.ebpf_unavailable = (
            "disabled in the configuration (ebpf = false)"
            if blklat is None
            else getattr(blklat, "unavailable", "")
        )
        # never blocked by a rate limit: a 429 leaves telemetry in the spool for later
        self.client = state.client(max_wait_s=0) if state else None
        self.view = AgentView()
        self.counters = Counters()
        self._last: Collection | None = None
        self._pending: list[TelemetryWindow] = []
        self._unspooled: TelemetryBatch | None = None  # _send_unspooled's batch in flight
        self._latest: dict[str, TelemetryWindow] = {}
        self._energy: dict[tuple[str, str, str], float] = {}
        self._device_ids: dict[str, uuid.UUID] = {}
        self._reported: set[str] | None = None  # devices the service knows, once reported
        # what the last inventory the service took said each device runs
        self._inventoried: dict[str, tuple[Scheduler | None, dict[str, int]]] = {}
        self._drift_seen: dict[str, tuple[Drift, ...]] = {}
        self.uevents = Uevents() if config.hotplug else None
        # per device: its policy's stance on other owners, and the devices where it yielded
        self._owner_policies: dict[str, OwnerPolicy] = {}
        self._yielded: set[str] = set()
        self._wanted_configs: dict[str, tuple[uuid.UUID, int, Any]] = {}  # the last applied
        self._policy_file = state_dir / "policies.json"
        self._policy_versions: dict[str, int] = (
            dict(read_json(self._policy_file)) if self._policy_file.exists() else {}
        )
        self._due = dict.fromkeys(("collect", "push", "policy", "inventory"), 0.0)
        self._renew_not_before = 0.0  # monotonic: after a failed renewal
        # device -> (policy version, the scheduler it asks for), from the last policy fetch
        self._wanted_schedulers: dict[str, tuple[int, str | None]] = {}
        self._paused: set[str] = set()  # devices whose policy is paused on this node
        self._paused_reported: dict[str, int] = {}  # and the version said to be paused
        self._failing: dict[str, str] = {}  # action -> the error of its streak of failures

    # --- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        recovered = self.applier.recover()
        if recovered:
            log.warning("undid a change to %s that a crash had interrupted", recovered)
        self.discover_and_report()
        self.collect()
        now = time.monotonic()
        self._due = {
            "collect": now + self.config.interval_s,
            "push": now + self.config.push_interval_s,
            "policy": now,
            "inventory": now + self.config.inventory_interval_s,
        }

    def step(self) -> float:
        """Do what is due; return the seconds until something is due again."""
        self.renew_token_if_due()
        if self.uevents is not None:
            self._isolated("hotplug", self.hotplug, self.config.policy_interval_s)
        intervals = {
            "collect": self.config.interval_s,
            "push": self.config.push_interval_s,
            "policy": self.config.policy_interval_s,
            "inventory": self.config.inventory_interval_s,
        }
        actions = {
            "collect": self.collect,
            "push": self.push,
            "policy": self.sync_policies,
            "inventory": self.discover_and_report,
        }
        for name, action in actions.items():
            now = time.monotonic()
            if now >= self._due[name]:
                # keep the cadence, but never try to catch up on missed ticks
                self._due[name] = max(self._due[name] + intervals[name], now + intervals[name] / 2)
                self._isolated(name, action, intervals[name])
        return max(0.0, min(self._due.values()) - time.monotonic())

    def _isolated(self, name: str, action: Callable[[], object], interval: float) -> None:
        """One action of the loop: what it raises is counted and logged, and the others go on
        (a policy that cannot be applied, a sysfs file that cannot be read, a bug) — the agent
        dying for it would stop the telemetry of every device, and a supervisor restarting it
        would meet the same error at the same step. The traceback is logged once per streak of
        the same error, and the recovery said."""
        try:
            action()
        except Exception as error:
            count = self.counters.action_failures
            count[name] = count.get(name, 0) + 1
            said = f"{type(error).__name__}: {error}"
            if self._failing.get(name) != said:
                log.exception(
                    "%s failed (tried again in %.0f s; the agent goes on)", name, interval
                )
                self._failing[name] = said
            return
        if self._failing.pop(name, None) is not None:
            log.warning("%s works again", name)

    def run(self, stop: threading.Event) -> None:
        self.start()
        try:
            while not stop.is_set():
                wait = self.step()
                if self.uevents is not None and self.uevents.socket is not None:
                    # woken by a device's announcement, and each second to see the stop
                    self.uevents.wait(min(wait, 1.0))
                else:
                    stop.wait(wait)
        finally:
            if self.uevents is not None:
                self.uevents.close()
            self.push()  # what was collected is spooled, whatever happens next
            self.spool.close()
            if self.client is not None:
                self.client.close()
            self.collectors.close()

    # --- identity ---------------------------------------------------------------------------

    def renew_token_if_due(self) -> bool:
        """Renew the node token once the service's renew-after time has passed: the new one is
        saved (atomically) before it is used, so a crash in between leaves the old one, which
        the service accepts for its grace period. A failure is retried a minute later, with a
        third of the token's life left to do it in. Returns whether the token changed."""
        state = self.state
        if self.client is None or state is None or state.renew_after is None:
            return False
        now = datetime.now(UTC)
        if now < state.renew_after or time.monotonic() < self._renew_not_before:
            return False
        try:
            issued = self.client.renew_token(state.node_id)
        except ServiceError as error:
            self._renew_not_before = time.monotonic() + RENEW_RETRY_S
            left = (
                f"; it expires at {state.token_expires_at.isoformat()}"
                if state.token_expires_at
                else ""
            )
            log.warning("node token not renewed (will retry): %s%s", error, left)
            return False
        renewed = dataclasses.replace(
            state,
            node_token=issued.node_token,
            token_expires_at=issued.expires_at,
            renew_after=issued.renew_after,
        )
        try:
            renewed.save(self.state_dir)
        except OSError as error:
            self._renew_not_before = time.monotonic() + RENEW_RETRY_S
            log.error("renewed node token not saved, so not used (will retry): %s", error)
            return False
        self.client.use_token(renewed.node_token)
        self.state = renewed
        self.counters.token_renewals += 1
        log.info("node token renewed; it expires at %s", issued.expires_at)
        return True

    # --- devices ----------------------------------------------------------------------------

    def discover_and_report(self) -> None:
        only = set(self.config.devices) if self.config.devices else None
        discovery = discover(self.paths, self.effects, only=only)
        self.view = _replace(self.view, discovery=discovery)
        if self.client is None or self.state is None:
            return
        report = InventoryReport(
            kernel_version=discovery.kernel.release,
            devices=[device.inventory for device in discovery.devices],
        )
        try:
            receipt = self.client.put_inventory(self.state.node_id, report)
        except ServiceError as error:
            log.warning("inventory not reported (will retry): %s", error)
            return
        self._device_ids = {d["name"]: uuid.UUID(d["id"]) for d in receipt["devices"]}
        self._reported = {d["name"] for d in receipt["devices"]}
        self._inventoried = {
            d.name: (
                d.inventory.capabilities.current_scheduler,
                d.inventory.capabilities.scheduler_tunables,
            )
            for d in discovery.devices
        }

    @property
    def device_names(self) -> set[str]:
        discovery = self.view.discovery
        return {d.name for d in discovery.devices} if discovery else set()

    # --- telemetry --------------------------------------------------------------------------

    def collect(self) -> None:
        results = self.collectors.collect(time.time())
        power = [s for name, r in results.items() if name in self.power_sources for s in r]
        disks: dict[str, DiskStats] | None = results.get("diskstats")
        if disks is None:
            return  # no window without diskstats; the next one spans the gap
        current = Collection(
            time.time(),
            time.monotonic(),
            disks,
            results.get("cpu"),
            power,
            results.get("blklat"),
        )
        node = None
        if self._last is not None:
            node, found = windows(self._last, current, self.device_names)
            self._pending.extend(found)
            self._spool_pending()  # durable at once: a kill -9 loses no collected window
            self.counters.windows_collected += len(found)
            self._latest.update({w.device: w for w in found})
            for energy in node.energies:
                key = (energy.source, energy.zone, energy.scope.value)
                self._energy[key] = self._energy.get(key, 0.0) + energy.joules
        self._last = current
        self.view = _replace(
            self.view,
            disks=disks,
            latest=dict(self._latest),
            power=power,
            node=node or self.view.node,
            energy_totals=dict(self._energy),
            context_switches=current.cpu.context_switches if current.cpu else None,
            latency=current.latency,
        )

    def _spool_pending(self) -> None:
        """Collected windows to the spool. A write that fails (a full or read-only disk) does
        not stop the agent: the windows wait in memory for the next collection's try — at most
        MAX_UNSPOOLED of them, the oldest dropped beyond that and counted — and the failures
        are counted (blkpilot_agent_spool_write_failures_total)."""
        while self._pending:
            chunk = self._pending[:MAX_WINDOWS_PER_BATCH]
            try:
                self.spool.add(chunk)
            except OSError as error:
                self.counters.spool_write_failures += 1
                log.error("windows not spooled (kept in memory, tried again): %s", error)
                excess = len(self._pending) - MAX_UNSPOOLED
                if excess > 0:
                    del self._pending[:excess]
                    self.counters.windows_unspooled_dropped += excess
                    self._unspooled = None  # its windows may be among those dropped
                return
            del self._pending[:MAX_WINDOWS_PER_BATCH]

    def push(self) -> DrainResult | None:
        """Spool what was collected (durably), then send the spool if the service answers."""
        self._spool_pending()
        result = None
        if self.client is not None:
            if self._reported is None:
                self.discover_and_report()  # the service must know the devices first
            if self._reported is not None:
                result = self.spool.drain(self.client.send_telemetry)
                self.counters.spool_rejected += result.rejected
                self.counters.windows_sent += result.windows
                self.counters.batches_held_for_clock += result.held_for_clock
                if not result.stopped:
                    self._send_unspooled()
                if not result.stopped and not self._pending:
                    self.view = _replace(self.view, last_push_ok=time.time())
                elif result.stopped:
                    log.warning("telemetry stays spooled: %s", result.stopped)
        self.counters.spool_dropped = self.spool.dropped
        self.view = _replace(
            self.view,
            spool_batches=len(self.spool.pending()),
            spool_bytes=self.spool.size_bytes(),
            clock_offset_s=self.client.clock_offset_s if self.client is not None else None,
            clock_hold=self.spool.clock_hold() is not None,
        )
        return result

    def _send_unspooled(self) -> None:
        """What waits in memory because the spool cannot be written (a full disk), sent as it
        is while the service answers: a full disk on the node does not stop its telemetry.
        Each batch keeps its id until it is acknowledged (a resend is idempotent); one the
        service refuses for good is dropped and counted, as it cannot be set aside on disk."""
        assert self.client is not None
        while self._pending:
            batch = self._unspooled
            if batch is None:
                batch = self._unspooled = TelemetryBatch.model_construct(
                    batch_id=uuid.uuid4(), windows=list(self._pending[:MAX_WINDOWS_PER_BATCH])
                )
            try:
                receipt = self.client.send_telemetry(batch)
            except ServiceUnreachable as error:
                log.warning("windows not spooled stay in memory: %s", error)
                return
            except ServiceRejected as error:
                if error.status >= 500 or error.status in RETRY_LATER or error.error == CLOCK_AHEAD:
                    log.warning("windows not spooled stay in memory: %s", error)
                    return
                log.error("service refused unspooled windows for good (dropped): %s", error)
                self.counters.spool_rejected += 1
            else:
                self.counters.windows_sent += receipt.windows
            del self._pending[: len(batch.windows)]
            self._unspooled = None

    # --- policies ---------------------------------------------------------------------------

    def sync_policies(self) -> None:
        if self.client is None or self.state is None:
            return
        try:
            self.client.heartbeat(
                self.state.node_id,
                Heartbeat(agent_version=__version__, kernel_version=platform.release()),
            )
            policies = (
                self.client.policies(self.state.node_id) if self.config.apply_policies else []
            )
        except ServiceError as error:
            log.warning("policies not fetched (will retry): %s", error)
            return
        self._wanted_schedulers = {
            str(p["device_name"]): (int(p["version"]), p["config"].get("scheduler"))
            for p in policies
        }
        paused = self._paused_policies(policies)
        for policy in policies:
            name, version = str(policy["device_name"]), int(policy["version"])
            if name in paused or name not in self.device_names:
                continue
            self._owner_policies[name] = OwnerPolicy(policy.get("owners") or "take_over")
            if self._policy_versions.get(name) != version:
                self._apply_policy(name, uuid.UUID(policy["device_id"]), version, policy["config"])
        self._check_drift()
        self._report_changed_configuration()

    def _paused_policies(self, policies: list[dict[str, Any]]) -> set[str]:
        """Devices an operator rolled back by hand on this node (agent/state.PausedPolicies):
        their policy is neither applied nor checked for drift, and the service is told once
        per version that it is paused and why. A newer policy version ends the pause; so does
        `blkpilot agent resume`, after which the policy is applied again."""
        store = PausedPolicies(self.state_dir)
        paused = store.load()
        for name in list(self._paused_reported):
            if name not in paused:  # resumed: apply the policy again
                del self._paused_reported[name]
                self._policy_versions.pop(name, None)
        for policy in policies:
            name, version = str(policy["device_name"]), int(policy["version"])
            hold = paused.get(name)
            if hold is None:
                continue
            held = hold.get("version")
            if isinstance(held, int) and version > held:
                store.resume(name)  # the policy changed since: the pause is over
                paused.pop(name)
                self._paused_reported.pop(name, None)
                self._policy_versions.pop(name, None)
                continue
            if self._paused_reported.get(name) != version and name in self.device_names:
                self._paused_reported[name] = version
                self._report(
                    uuid.UUID(policy["device_id"]),
                    AppliedStateReport(
                        policy_version=version,
                        status=AppliedStatus.PAUSED,
                        config=self._current_config(name),
                        detail=(
                            f"paused on the node: {hold.get('why', 'rolled back by hand')};"
                            f" a new policy version or `blkpilot agent resume {name}` ends it"
                        )[:2000],
                    ),
                )
        self._paused = set(paused)
        return self._paused

    def _report_changed_configuration(self) -> None:
        """A device whose scheduler or tunables changed since the inventory was reported (by an
        operator, udev, a sweep or canary that finished) is reported again now, not an
        inventory interval later: the nightly job recommends from what a device runs. A device
        a canary or sweep holds is left alone: it is between configurations."""
        for name, reported in self._inventoried.items():
            now = queue_configuration(self.paths.queue(name))
            if now == reported:
                continue
            try:
                busy = self.applier.busy(name)
            except ChangeRefused:  # the device is gone: the inventory will say so
                busy = False
            if not busy:
                log.info(
                    "%s now runs %s: reporting the inventory again",
                    name,
                    now[0].value if now[0] else "an unknown scheduler",
                )
                self.discover_and_report()
                return

    def _apply_policy(
        self, name: str, device_id: uuid.UUID, version: int, wanted: Any, why: str = ""
    ) -> None:
        self._wanted_configs[name] = (device_id, version, wanted)
        config = DeviceConfig.model_validate(wanted)
        if self._owner_policies.get(name) is OwnerPolicy.YIELD:
            standing = self._standing_owners(name, config)
            if standing:
                self._yielded.add(name)
                self.counters.applies["yielded"] += 1
                self._report(
                    device_id,
                    AppliedStateReport(
                        policy_version=version,
                        status=AppliedStatus.YIELDED,
                        config=self._current_config(name),
                        detail=(
                            "not applied: the policy yields to "
                            + "; ".join(standing)
                            + " (blkpilot recommends, the other owner's setting stands)"
                        )[:2000],
                    ),
                )
                self._policy_versions[name] = version
                write_json_atomic(self._policy_file, self._policy_versions)
                return
        self._yielded.discard(name)
        note = ""
        if calibrate.needs_calibration(config) and self.config.calibrate_fios:
            calibration = self._calibration(name)
            config, note = calibrate.with_costs(config, calibration), f"; {calibration.note}"
        try:
            with self.applier.device_lock(name):  # after a canary under way, never amid it
                result = self.applier.apply(name, config)
            status, detail = AppliedStatus.APPLIED, f"{why}read back: {result.after}{note}"
            reported = config
        except (ChangeRefused, ChangeFailed) as error:
            status = (
                AppliedStatus.ROLLED_BACK
                if isinstance(error, ChangeFailed)
                else AppliedStatus.FAILED
            )
            detail, reported = str(error), self._current_config(name)
        self.counters.applies["applied" if status is AppliedStatus.APPLIED else "failed"] += 1
        self._report(
            device_id,
            AppliedStateReport(
                policy_version=version, status=status, config=reported, detail=detail[:2000]
            ),
        )
        self._policy_versions[name] = version
        write_json_atomic(self._policy_file, self._policy_versions)

    def _calibration(self, name: str) -> calibrate.Calibration:
        """fios' costs for a device: measured once (scratch devices only), then remembered."""
        known = self.calibrations.get(name)
        if known is not None:
            return known
        try:
            target = device_target(self.paths, name, self.effects)
            found = calibrate.measure(
                target,
                workdir=self.state_dir / "calibration-work",
                paths=self.paths,
                effects=self.effects,
                seconds=self.config.calibration_seconds,
            )
        except AgentError as error:
            log.warning("fios calibration of %s failed: %s", name, error)
            return calibrate.Calibration(
                name, {}, "", f"not calibrated ({error}); fios charges elapsed time / parallelism"
            )
        self.calibrations.put(found)
        log.info("%s", found.note)
        return found

    def _check_drift(self) -> None:
        drift: dict[str, list[Drift]] = {}
        for name in sorted(self._policy_versions):
            if name not in self.device_names or name in self._paused or name in self._yielded:
                continue
            found = self.applier.drift(name)
            if not any(d.attribute == "scheduler" for d in found):
                found += self._policy_drift(name)
            if found:
                drift[name] = found
            before = self._drift_seen.get(name, ())
            if tuple(found) == before:
                continue  # reported already (or still none)
            self._drift_seen[name] = tuple(found)
            if not found and name in self._device_ids:  # back in line: say so
                self._report(
                    self._device_ids[name],
                    AppliedStateReport(
                        policy_version=self._policy_versions[name],
                        status=AppliedStatus.APPLIED,
                        config=self._current_config(name),
                        detail="drift resolved: the device is back on what was applied",
                    ),
                )
            if found and name in self._device_ids:
                self.counters.drift_reports += 1
                whom = [self._by_whom(name, d) for d in found]
                detail = "; ".join(
                    f"{d.attribute}: {d.actual!r}, not {d.expected!r}{by}"
                    for d, by in zip(found, whom, strict=True)
                )
                self._report(
                    self._device_ids[name],
                    AppliedStateReport(
                        policy_version=self._policy_versions[name],
                        status=AppliedStatus.DRIFT,
                        config=self._current_config(name),
                        detail=f"changed behind blkpilot: {detail}",
                    ),
                )
                if any(whom) and self._owner_policies.get(name) is OwnerPolicy.TAKE_OVER:
                    self._take_over(name, detail)
                    drift.pop(name, None)
        self.view = _replace(self.view, drift=drift)

    def hotplug(self) -> list[str]:
        """Devices the kernel announced (added, changed) whose queue no longer holds what their
        policy applied — a disk back after a reset, a loop device removed and added again — get
        the policy back now, not at the next policy check; returns their names."""
        assert self.uevents is not None
        again = []
        for name in sorted(self.uevents.block_devices()):
            wanted = self._wanted_configs.get(name)
            if (
                wanted is None
                or name not in self.device_names
                or name in self._paused
                or name in self._yielded
                or self.applier.busy(name)  # a canary or sweep holds it: between configurations
                or not self.applier.drift(name)
            ):
                continue
            device_id, version, config = wanted
            log.info("%s: announced by the kernel without its policy: applying it again", name)
            self.counters.applies["hotplug"] += 1
            self._apply_policy(
                name, device_id, version, config, "the kernel announced the device again; "
            )
            self._drift_seen[name] = ()
            again.append(name)
        return again

    def _take_over(self, name: str, what: str) -> None:
        """The policy applied again after another owner set the device back (take_over): once
        per change that owner makes — the next check then finds the device in line, and only
        a new change of the other owner's is drift again."""
        wanted = self._wanted_configs.get(name)
        if wanted is None:
            return
        device_id, version, config = wanted
        log.info("%s: taking the policy back over (%s)", name, what)
        self.counters.applies["taken_over"] += 1
        self._apply_policy(name, device_id, version, config, f"taken back over: {what}; ")
        self._drift_seen[name] = ()

    def _standing_owners(self, name: str, config: DeviceConfig) -> list[str]:
        """Other owners that certainly set an attribute this configuration sets, said."""
        sets = {f"iosched/{k}" for k in config.scheduler_tunables} | {
            attribute
            for attribute in ("scheduler", "nr_requests", "read_ahead_kb")
            if getattr(config, attribute) is not None
        }
        return [
            owned_by(owner.model_dump(mode="json"))
            for owner in owners(self.paths, name)
            if owner.certain and sets & set(owner.settings)
        ]

    def _by_whom(self, name: str, drift: Drift) -> str:
        """ ", by udev rule 60-ioschedulers.rules:3 (scheduler=bfq)" where another owner of the
        device's queue sets the attribute to the value found (agent.owners); else nothing."""
        attribute = drift.attribute.split(" ")[0]
        for owner in owners(self.paths, name):
            value = owner.settings.get(attribute)
            if value is not None and value.lstrip(">") == (drift.actual or ""):
                return f", by {owned_by(owner.model_dump(mode='json'))}"
        return ""

    def _policy_drift(self, name: str) -> list[Drift]:
        """The scheduler the device's policy asks for, when another blkpilot change came after
        it (a rollout's restore, an operator's `agent apply`): the applier's record then holds
        that change, not the policy. A device a canary or sweep holds is between
        configurations, and left alone."""
        version, wanted = self._wanted_schedulers.get(name, (None, None))
        if wanted is None or self._policy_versions.get(name) != version:
            return []
        try:
            if self.applier.busy(name):
                return []
            actual = self.applier.read(name, "scheduler")
        except ChangeRefused:
            return []
        if actual == wanted:
            return []
        return [Drift("scheduler (policy)", wanted, actual)]

    def _current_config(self, name: str) -> DeviceConfig:
        return self.applier.current(name)

    def _report(self, device_id: uuid.UUID, report: AppliedStateReport) -> None:
        if self.client is None:
            return
        try:
            self.client.report_applied(device_id, report)
        except AgentError as error:
            log.warning("applied state not reported: %s", error)


def _replace(view: AgentView, **changes: Any) -> AgentView:
    return AgentView(**{**view.__dict__, **changes})
