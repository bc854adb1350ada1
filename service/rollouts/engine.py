"""The rollout worker: takes a lease on a rollout with work to do and carries it one step
further; every step's result is committed before the next begins, so a service stopped at
any point (or a worker that died, once its lease runs out) is picked up where it was.

Steps of a running rollout, per stage:
- canary: devices a previous worker left half-done are first put back as the rollout found
  them; then `rollout.yml` runs on the stage's pending devices (ansible `serial` batches,
  `max_fail_percentage`). Each device's outcome is stored and audited. The gate: if more than
  max_fail_percentage of the stage's nodes failed, the rollout rolls back; if a canary was
  inconclusive it pauses for an operator; otherwise the devices that passed get the
  configuration as their policy and the soak begins.
- soak: until soak_until, guardrails are checked on every device changed so far (the agent
  reports the policy applied and holding; telemetry latency within the ratio). A breach rolls
  back; at the end the next stage starts, or the rollout has succeeded.
Rolling back runs `rollback.yml` on every device the rollout touched (each puts back its own
capture) and restores the policies it replaced."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy.orm import Session

from agent.contract.tunables import DeviceConfig
from service.audit import service as audit
from service.db import Database
from service.errors import BlkpilotError
from service.policies import repository as policy_repository
from service.policies import service as policy_service
from service.recommendations import service as recommendations
from service.rollouts import repository
from service.rollouts.ansible import Outcome, RunReport
from service.security import Principal
from service.tables import Rollout, RolloutTarget
from service.telemetry import repository as telemetry_repository

log = logging.getLogger(__name__)

TOUCHED = ("changing", "passed", "failed", "inconclusive", "rolling_back", "restore_failed")


class Runner(Protocol):
    def run(
        self,
        playbook: str,
        targets: dict[str, list[str]],
        extravars: dict[str, object],
        *,
        ident: str,
        cancel: Callable[[], bool],
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> RunReport: ...


def _now() -> datetime:
    return datetime.now(UTC)


def _by_host(targets: Sequence[RolloutTarget]) -> dict[str, list[str]]:
    hosts: dict[str, list[str]] = {}
    for target in targets:
        hosts.setdefault(target.hostname, []).append(target.device_name)
    return hosts


class Engine:
    def __init__(
        self,
        database: Database,
        runner: Runner,
        *,
        owner: str | None = None,
        lease_seconds: float = 30.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.database = database
        self.runner = runner
        self.owner = owner or f"worker-{uuid.uuid4().hex[:12]}"
        self.lease = timedelta(seconds=lease_seconds)
        self.stop = stop or threading.Event()

    # --- leases ------------------------------------------------------------------------------

    def claim(self) -> uuid.UUID | None:
        with self.database.sessionmaker() as session, session.begin():
            now = _now()
            return repository.claim(session, self.owner, now, now + self.lease)

    def release(self) -> None:
        with self.database.sessionmaker() as session, session.begin():
            repository.release(session, self.owner)

    def _watch(self, rollout_id: uuid.UUID, expected: str) -> Callable[[], bool]:
        """ansible-runner's cancel callback: keeps the lease alive, and cancels the run when
        the service stops, the lease is lost, or an operator changed the rollout's status."""
        state = {"checked": 0.0, "cancel": False}
        every = max(0.5, self.lease.total_seconds() / 4)

        def cancel() -> bool:
            if self.stop.is_set():
                return True
            if time.monotonic() - state["checked"] >= every:
                state["checked"] = time.monotonic()
                with self.database.sessionmaker() as session, session.begin():
                    status = repository.extend_lease(
                        session, rollout_id, self.owner, _now() + self.lease
                    )
                state["cancel"] = status != expected
                if state["cancel"]:
                    log.warning(
                        "rollout %s: %s; cancelling the playbook",
                        rollout_id,
                        "lease lost" if not status else f"now {status}",
                    )
            return bool(state["cancel"])

        return cancel

    # --- steps -------------------------------------------------------------------------------

    def step(self, rollout_id: uuid.UUID) -> None:
        with self.database.sessionmaker() as session:
            rollout = repository.get(session, rollout_id)
            if rollout is None or rollout.lease_owner != self.owner:
                return
            status, phase = rollout.status, rollout.phase
        if status == "rolling_back":
            self._roll_back(rollout_id)
        elif status == "running" and phase == "canary":
            self._canary(rollout_id)
        elif status == "running" and phase == "soak":
            self._soak(rollout_id)

    def _actor(self, rollout: Rollout) -> Principal:
        return Principal(name=f"rollout:{rollout.name}")

    def _canary(self, rollout_id: uuid.UUID) -> None:
        with self.database.sessionmaker() as session, session.begin():
            rollout = repository.get(session, rollout_id, lock=True)
            assert rollout is not None
            stage = [t for t in repository.targets(session, rollout.id) if t.stage == rollout.stage]
            interrupted = [t for t in stage if t.status == "changing"]
            extravars = self._extravars(rollout)
        if interrupted:
            # a previous worker stopped mid-canary: put those devices back as the rollout
            # found them, then they get a fresh canary
            report = self._run(rollout_id, "rollback.yml", interrupted, extravars, "recover")
            if report is None:
                return
            with self.database.sessionmaker() as session, session.begin():
                failed = self._record_restores(session, rollout_id, report, then="pending")
                rollout = repository.get(session, rollout_id, lock=True)
                assert rollout is not None
                audit.record(
                    session,
                    self._actor(rollout),
                    "rollout.recovered",
                    target_type="rollout",
                    target_id=rollout.id,
                    after={"devices": len(interrupted)},
                    detail=f"stage {rollout.stage + 1}: {len(interrupted)} device(s) left"
                    " mid-canary by a stopped worker were put back for a fresh canary",
                )
                if failed:
                    self._start_rollback(
                        session, rollout, f"could not put back {', '.join(failed)}"
                    )
                    return
        with self.database.sessionmaker() as session, session.begin():
            rollout = repository.get(session, rollout_id, lock=True)
            assert rollout is not None
            if rollout.status != "running":
                return
            stage = [t for t in repository.targets(session, rollout.id) if t.stage == rollout.stage]
            todo = [t for t in stage if t.status == "pending"]
            for target in todo:
                target.status, target.attempts = "changing", target.attempts + 1
                target.updated_at = _now()
            if rollout.stage_started_at is None:
                rollout.stage_started_at = _now()
            rollout.status_detail = (
                f"stage {rollout.stage + 1}/{len(rollout.stages)}: canaries on"
                f" {len(_by_host(todo))} node(s)"
            )
            rollout.updated_at = _now()
        if todo:
            recorded: set[tuple[str, str]] = set()

            def record(outcome: Outcome) -> None:  # live: progress shows as it happens
                with self.database.sessionmaker() as session, session.begin():
                    self._record_canaries(session, rollout_id, [outcome])
                recorded.add((outcome.hostname, outcome.device))

            report = self._run(rollout_id, "rollout.yml", todo, extravars, "canary", record)
            if report is None:
                return
            rest = [o for o in report.outcomes if (o.hostname, o.device) not in recorded]
            with self.database.sessionmaker() as session, session.begin():
                self._record_canaries(session, rollout_id, rest)
        with self.database.sessionmaker() as session, session.begin():
            self._gate(session, rollout_id)

    def _extravars(self, rollout: Rollout) -> dict[str, object]:
        canary = rollout.canary
        return {
            "rollout_id": str(rollout.id),
            "rollout_config": DeviceConfig.model_validate(rollout.config).model_dump(
                mode="json", exclude_none=True
            ),
            "rollout_workload": rollout.workload_name,
            "rollout_rounds": canary["rounds"],
            # stored before the budget existed: the agent's default, three times the rounds
            "rollout_max_rounds": canary.get("max_rounds") or 3 * canary["rounds"],
            "rollout_round_seconds": canary["round_seconds"],
            "rollout_alpha": canary["alpha"],
            "rollout_sli": canary.get("sli"),  # None: block latency alone
            "rollout_loop": canary.get("loop", "auto"),  # stored before it existed: auto
            "rollout_serial": rollout.serial,
            "rollout_max_fail_percentage": rollout.max_fail_percentage,
        }

    def _run(
        self,
        rollout_id: uuid.UUID,
        playbook: str,
        targets: Sequence[RolloutTarget],
        extravars: dict[str, object],
        what: str,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> RunReport | None:
        """Run a playbook; None if it was cancelled (the state stays as it is for the next
        worker or step to pick up)."""
        with self.database.sessionmaker() as session:
            rollout = repository.get(session, rollout_id)
            assert rollout is not None
            expected = rollout.status
        ident = f"{rollout_id}/{_now():%Y%m%dT%H%M%S}-{what}"
        report = self.runner.run(
            playbook,
            _by_host(targets),
            extravars,
            ident=ident,
            cancel=self._watch(rollout_id, expected),
            on_outcome=on_outcome,
        )
        log.info(
            "rollout %s: %s %s -> %s (rc %s)", rollout_id, what, playbook, report.status, report.rc
        )
        if report.status == "canceled":
            return None
        return report

    def _record_canaries(
        self, session: Session, rollout_id: uuid.UUID, outcomes: Sequence[Outcome]
    ) -> None:
        rollout = repository.get(session, rollout_id, lock=True)
        assert rollout is not None
        targets = {(t.hostname, t.device_name): t for t in repository.targets(session, rollout_id)}
        status_of = {
            "pass": "passed",
            "fail": "failed",
            "inconclusive": "inconclusive",
            "error": "failed",
            "not_run": "pending",
        }
        for outcome in outcomes:
            target = targets[(outcome.hostname, outcome.device)]
            target.status = status_of[outcome.result]
            target.verdict = outcome.result if outcome.result != "not_run" else None
            target.detail = outcome.detail
            target.updated_at = _now()
            audit.record(
                session,
                self._actor(rollout),
                "rollout.host",
                target_type="rollout",
                target_id=rollout.id,
                after={
                    "host": outcome.hostname,
                    "device": outcome.device,
                    "device_id": str(target.device_id),
                    "stage": target.stage,
                    "result": outcome.result,
                },
                detail=f"{outcome.hostname}/{outcome.device}: {outcome.result}"
                f"{'; ' + outcome.detail.splitlines()[0] if outcome.detail else ''}",
            )

    def _gate(self, session: Session, rollout_id: uuid.UUID) -> None:
        rollout = repository.get(session, rollout_id, lock=True)
        assert rollout is not None
        if rollout.status != "running":
            return
        stage = [t for t in repository.targets(session, rollout.id) if t.stage == rollout.stage]
        nodes = _by_host(stage)
        failed_nodes = sorted({t.hostname for t in stage if t.status == "failed"})
        label = f"stage {rollout.stage + 1}/{len(rollout.stages)}"
        if len(failed_nodes) * 100 > rollout.max_fail_percentage * len(nodes):
            shown = "; ".join(
                f"{t.hostname}/{t.device_name}: {t.verdict}" for t in stage if t.status == "failed"
            )
            self._start_rollback(session, rollout, f"{label}: canary failed ({shown})")
            return
        inconclusive = [t for t in stage if t.status == "inconclusive"]
        if inconclusive and rollout.canary.get("on_inconclusive") == "roll_back":
            shown = "; ".join(f"{t.hostname}/{t.device_name}" for t in inconclusive)
            self._start_rollback(
                session, rollout, f"{label}: canary inconclusive ({shown}); not kept unproven"
            )
            return
        waiting = [t for t in stage if t.status in ("inconclusive", "pending")]
        if waiting:
            rollout.status = "paused"
            rollout.status_detail = f"{label}: paused for an operator: " + "; ".join(
                f"{t.hostname}/{t.device_name}: "
                + ("inconclusive canary" if t.status == "inconclusive" else "not run")
                for t in waiting
            )
            rollout.updated_at = _now()
            audit.record(
                session,
                self._actor(rollout),
                "rollout.paused",
                target_type="rollout",
                target_id=rollout.id,
                after={"status": "paused"},
                detail=rollout.status_detail,
            )
            return
        actor = self._actor(rollout)
        config = DeviceConfig.model_validate(rollout.config)
        for target in stage:
            if target.status != "passed":
                continue
            policy = policy_repository.for_device(session, target.device_id)
            target.previous_policy = (
                {"config": policy.config, "version": policy.version} if policy else {"config": None}
            )
            policy_service.set_policy(
                session,
                actor,
                target.device_id,
                config,
                f"rollout {rollout.name!r} stage {rollout.stage + 1}: canary passed",
            )
        rollout.phase = "soak"
        rollout.soak_until = _now() + timedelta(seconds=rollout.soak_seconds)
        rollout.status_detail = (
            f"{label}: every canary passed; soaking until {rollout.soak_until:%H:%M:%S}"
        )
        rollout.updated_at = _now()
        audit.record(
            session,
            actor,
            "rollout.stage_passed",
            target_type="rollout",
            target_id=rollout.id,
            after={"stage": rollout.stage, "nodes": sorted(nodes)},
            detail=rollout.status_detail,
        )

    def _soak(self, rollout_id: uuid.UUID) -> None:
        with self.database.sessionmaker() as session, session.begin():
            rollout = repository.get(session, rollout_id, lock=True)
            assert rollout is not None
            if rollout.status != "running" or rollout.phase != "soak":
                return
            breach = self._guardrail_breach(session, rollout)
            label = f"stage {rollout.stage + 1}/{len(rollout.stages)}"
            if breach:
                self._start_rollback(session, rollout, f"{label}: guardrail breached: {breach}")
                return
            assert rollout.soak_until is not None
            if _now() < rollout.soak_until:
                return
            rollout.stage += 1
            rollout.phase, rollout.soak_until, rollout.stage_started_at = "canary", None, None
            rollout.updated_at = _now()
            if rollout.stage >= len(rollout.stages):
                rollout.status, rollout.finished_at = "succeeded", _now()
                rollout.status_detail = "every stage passed its canaries and its soak"
                action = "rollout.succeeded"
            else:
                rollout.status_detail = f"{label} soaked without a breach"
                action = "rollout.soaked"
            audit.record(
                session,
                self._actor(rollout),
                action,
                target_type="rollout",
                target_id=rollout.id,
                after={"stage": rollout.stage},
                detail=rollout.status_detail,
            )
            if rollout.status == "succeeded":
                recommendations.rollout_finished(session, rollout)

    def _guardrail_breach(self, session: Session, rollout: Rollout) -> str:
        """What breached, or ''. Checked on every device changed so far."""
        changed = [t for t in repository.targets(session, rollout.id) if t.status == "passed"]
        limit = float(rollout.guardrails["max_latency_ratio"])
        need = int(rollout.guardrails["min_windows"])
        assert rollout.soak_until is not None
        soak_start = rollout.soak_until - timedelta(seconds=rollout.soak_seconds)
        for target in changed:
            policy = policy_repository.for_device(session, target.device_id)
            if (
                policy is not None
                and policy.applied_status in ("failed", "drift")
                and policy.applied_at is not None
                and policy.applied_at >= soak_start
            ):
                return (
                    f"{target.hostname}/{target.device_name}: the agent reports"
                    f" {policy.applied_status}: {policy.applied_detail or ''}"[:500]
                )
            ratio = self._latency_ratio(session, target.device_id, soak_start, need)
            if ratio is not None and ratio > limit:
                return (
                    f"{target.hostname}/{target.device_name}: mean latency {ratio:.2f}x what it"
                    f" was before the change (limit {limit:.2f}x)"
                )
        return ""

    @staticmethod
    def _latency_ratio(
        session: Session, device_id: uuid.UUID, since: datetime, need: int
    ) -> float | None:
        after, n_after = telemetry_repository.busy_mean_latency(
            session, device_id, starting_from=since
        )
        span = _now() - since
        before, n_before = telemetry_repository.busy_mean_latency(
            session,
            device_id,
            starting_from=since - max(span, timedelta(minutes=10)),
            ending_by=since,
        )
        if n_after < need or n_before < need or not before or after is None:
            return None
        return after / before

    def _start_rollback(self, session: Session, rollout: Rollout, why: str) -> None:
        rollout.status = "rolling_back"
        rollout.status_detail = why[:4000]
        rollout.updated_at = _now()
        audit.record(
            session,
            self._actor(rollout),
            "rollout.aborted",
            target_type="rollout",
            target_id=rollout.id,
            after={"status": "rolling_back"},
            detail=why[:4000],
        )

    def _roll_back(self, rollout_id: uuid.UUID) -> None:
        with self.database.sessionmaker() as session, session.begin():
            rollout = repository.get(session, rollout_id, lock=True)
            assert rollout is not None
            touched = [t for t in repository.targets(session, rollout_id) if t.status in TOUCHED]
            for target in touched:
                target.status, target.updated_at = "rolling_back", _now()
            extravars = self._extravars(rollout)
        report = None
        if touched:
            report = self._run(rollout_id, "rollback.yml", touched, extravars, "rollback")
            if report is None:
                return
        with self.database.sessionmaker() as session, session.begin():
            rollout = repository.get(session, rollout_id, lock=True)
            assert rollout is not None
            failed = (
                self._record_restores(session, rollout_id, report, then="rolled_back")
                if report is not None
                else []
            )
            rollout.status = "failed" if failed else "rolled_back"
            rollout.finished_at = rollout.updated_at = _now()
            outcome = (
                f"could not put back {', '.join(failed)}"
                if failed
                else f"{len(touched)} device(s) put back as the rollout found them"
            )
            rollout.status_detail = f"{outcome} (after: {rollout.status_detail})"[:4000]
            audit.record(
                session,
                self._actor(rollout),
                f"rollout.{rollout.status}",
                target_type="rollout",
                target_id=rollout.id,
                after={"devices": len(touched), "failed": failed},
                detail=rollout.status_detail,
            )
            recommendations.rollout_finished(session, rollout)

    def _record_restores(
        self, session: Session, rollout_id: uuid.UUID, report: RunReport, *, then: str
    ) -> list[str]:
        """Store each device's restore and put its policy back; the devices that failed."""
        rollout = repository.get(session, rollout_id)
        assert rollout is not None
        targets = {(t.hostname, t.device_name): t for t in repository.targets(session, rollout_id)}
        failed = []
        actor = self._actor(rollout)
        for outcome in report.outcomes:
            target = targets[(outcome.hostname, outcome.device)]
            name = f"{outcome.hostname}/{outcome.device}"
            if outcome.result != "restored":
                target.status, target.detail = "restore_failed", outcome.detail
                failed.append(name)
            else:
                target.status = then
                target.detail = f"{outcome.detail} (was: {target.verdict or 'not run'})"
                self._restore_policy(session, rollout, target, actor)
            target.updated_at = _now()
            audit.record(
                session,
                actor,
                "rollout.host_restored",
                target_type="rollout",
                target_id=rollout.id,
                after={
                    "host": outcome.hostname,
                    "device": outcome.device,
                    "result": outcome.result,
                },
                detail=f"{name}: {outcome.detail.splitlines()[0] if outcome.detail else ''}",
            )
        return failed

    @staticmethod
    def _restore_policy(
        session: Session, rollout: Rollout, target: RolloutTarget, actor: Principal
    ) -> None:
        previous = target.previous_policy
        if previous is None:
            return  # the rollout never set a policy on this device
        why = f"rollout {rollout.name!r} rolled back"
        try:
            if previous.get("config") is None:
                if policy_repository.for_device(session, target.device_id) is not None:
                    policy_service.clear_policy(session, actor, target.device_id, why)
            else:
                config = DeviceConfig.model_validate(previous["config"])
                policy_service.set_policy(session, actor, target.device_id, config, why)
        except BlkpilotError as error:
            target.detail = f"{target.detail}; policy not restored: {error.detail}"[:2000]
        target.previous_policy = None
