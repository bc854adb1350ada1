"""The rollout engine's decisions, one step at a time, on a real PostgreSQL. A scripted runner
stands in for ansible here so that each outcome (an inconclusive canary, a tolerated failure, a
cancelled run) can be chosen; tests/test_rollouts.py runs the real playbooks end to end."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.contract.tunables import DeviceConfig, Scheduler
from agent.contract.wire import AppliedStateReport, AppliedStatus
from service import db
from service.db import Database
from service.errors import Conflict, Unprocessable
from service.policies import service as policy_service
from service.recommendations import service as recommendations
from service.recommendations.schemas import Acceptance
from service.rollouts import repository
from service.rollouts import service as rollouts
from service.rollouts.ansible import Outcome, Result, RunReport
from service.rollouts.engine import Engine
from service.rollouts.schemas import RolloutCreate
from service.security import Principal, Role
from service.tables import (
    AuditEvent,
    Device,
    Policy,
    RecommendationRow,
    Rollout,
    TelemetryBatchRow,
    TelemetryWindowRow,
)
from tests.conftest import create_database, drop_database
from tests.factories import create_node, create_recommendation, device_inventory, report_inventory

OPERATOR = Principal(name="op", role=Role.OPERATOR)


@dataclass
class ScriptedRunner:
    """Answers each canary from a script per host (default pass); restores always succeed."""

    script: dict[str, list[Result]] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)
    extravars: list[dict[str, object]] = field(default_factory=list)
    cancel_next: bool = False

    def run(
        self,
        playbook: str,
        targets: dict[str, list[str]],
        extravars: dict[str, object],
        *,
        ident: str,
        cancel: Callable[[], bool],
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> RunReport:
        self.calls.append((playbook, dict(targets)))
        self.extravars.append(dict(extravars))
        if self.cancel_next:
            self.cancel_next = False
            return RunReport([], "canceled", None, Path())
        outcomes = []
        for host, devices in targets.items():
            for device in devices:
                if playbook == "rollback.yml":
                    outcomes.append(Outcome(host, device, "restored", "put back as found"))
                    continue
                queue = self.script.get(host, [])
                outcomes.append(Outcome(host, device, queue.pop(0) if queue else "pass", ""))
        return RunReport(outcomes, "successful", 0, Path())


@pytest.fixture(scope="module")
def database(server_url: str) -> Iterator[Database]:
    name = f"blkpilot_engine_{uuid.uuid4().hex[:8]}"
    url = create_database(server_url, name)
    db.upgrade(url)
    database = Database(db.create_db_engine(url, pool_size=4))
    yield database
    database.dispose()
    drop_database(server_url, name)


def _fleet(database: Database, hosts: int) -> str:
    label = uuid.uuid4().hex[:8]
    with database.sessionmaker() as session, session.begin():
        for index in range(hosts):
            node, _ = create_node(session, hostname=f"{label}-{index}", labels={"fleet": label})
            report_inventory(session, node, device_inventory("loop0"))
    return label


def _start(database: Database, label: str, **body: object) -> uuid.UUID:
    request = RolloutCreate.model_validate(
        {
            "name": f"r-{label}",
            "reason": "engine test",
            "config": {"scheduler": "none"},
            "target": {"node_labels": {"fleet": label}},
            "soak_seconds": 0,
            **body,
        }
    )
    with database.sessionmaker() as session, session.begin():
        return rollouts.create(session, OPERATOR, request).id


def _drive(engine: Engine, rollout_id: uuid.UUID, steps: int = 20) -> Rollout:
    """Step until the rollout waits for someone (paused) or ended."""
    for _ in range(steps):
        assert engine.claim() == rollout_id
        engine.step(rollout_id)
        with engine.database.sessionmaker() as session:
            rollout = session.get(Rollout, rollout_id)
            assert rollout is not None
            if rollout.status not in ("running", "rolling_back"):
                return rollout
    raise AssertionError("the rollout did not settle")


def _targets(session: Session, rollout_id: uuid.UUID) -> dict[str, str]:
    return {t.hostname: t.status for t in repository.targets(session, rollout_id)}


def test_inconclusive_pauses_and_resume_runs_that_canary_again(database: Database) -> None:
    label = _fleet(database, 2)
    runner = ScriptedRunner({f"{label}-1": ["inconclusive", "pass"]})
    engine = Engine(database, runner)
    rollout_id = _start(database, label, stages=["100%"])
    paused = _drive(engine, rollout_id)
    assert paused.status == "paused"
    assert "inconclusive" in paused.status_detail
    with database.sessionmaker() as session:
        assert _targets(session, rollout_id) == {
            f"{label}-0": "passed",
            f"{label}-1": "inconclusive",
        }
        # nothing becomes a policy before the whole stage has passed
        assert session.scalars(select(Policy)).all() == []
    assert engine.claim() is None  # a paused rollout is nobody's work
    with database.sessionmaker() as session, session.begin():
        rollouts.resume(session, OPERATOR, rollout_id, "looked at it")
    done = _drive(engine, rollout_id)
    assert done.status == "succeeded", done.status_detail
    assert runner.calls[-1] == ("rollout.yml", {f"{label}-1": ["loop0"]})  # only that one again


def test_max_fail_percentage_tolerates_a_failure_but_not_more(database: Database) -> None:
    label = _fleet(database, 2)
    engine = Engine(database, ScriptedRunner({f"{label}-0": ["fail"]}))
    tolerant = _start(database, label, stages=["100%"], max_fail_percentage=50)
    done = _drive(engine, tolerant)
    assert done.status == "succeeded", done.status_detail
    with database.sessionmaker() as session:
        assert _targets(session, tolerant) == {f"{label}-0": "failed", f"{label}-1": "passed"}
        policies = session.scalars(select(Policy)).all()
        # the failed device keeps its configuration: only the one that passed has the policy
        failed_device = next(
            t.device_id for t in repository.targets(session, tolerant) if t.status == "failed"
        )
        assert failed_device not in {p.device_id for p in policies}

    label = _fleet(database, 2)
    strict = Engine(database, ScriptedRunner({f"{label}-0": ["fail"]}))
    rollout_id = _start(database, label, stages=["100%"])
    done = _drive(strict, rollout_id)
    assert done.status == "rolled_back"
    assert strict.runner.calls[-1][0] == "rollback.yml"  # type: ignore[attr-defined]


def test_a_lease_keeps_other_workers_off_until_it_expires(database: Database) -> None:
    label = _fleet(database, 1)
    rollout_id = _start(database, label)
    first = Engine(database, ScriptedRunner(), lease_seconds=0.5)
    second = Engine(database, ScriptedRunner(), lease_seconds=30)
    assert first.claim() == rollout_id
    assert second.claim() is None
    time.sleep(0.6)  # the first worker died: its lease runs out
    assert second.claim() == rollout_id
    assert first.claim() is None


def test_a_cancelled_run_is_recovered_before_its_canaries_run_again(database: Database) -> None:
    label = _fleet(database, 1)
    runner = ScriptedRunner(cancel_next=True)
    engine = Engine(database, runner)
    rollout_id = _start(database, label, stages=["100%"])
    assert engine.claim() == rollout_id
    engine.step(rollout_id)  # the canary run was cancelled (the service stopped)
    with database.sessionmaker() as session:
        assert _targets(session, rollout_id) == {f"{label}-0": "changing"}
    done = _drive(engine, rollout_id)
    assert done.status == "succeeded"
    assert [call[0] for call in runner.calls] == ["rollout.yml", "rollback.yml", "rollout.yml"]
    with database.sessionmaker() as session:
        actions = session.scalars(
            select(AuditEvent.action).where(AuditEvent.target_id == str(rollout_id))
        ).all()
    assert "rollout.recovered" in actions


def test_latency_growing_beyond_the_ratio_in_the_soak_rolls_back(database: Database) -> None:
    label = _fleet(database, 2)
    engine = Engine(database, ScriptedRunner())
    rollout_id = _start(
        database,
        label,
        stages=["1", "100%"],
        soak_seconds=3600,
        guardrails={"max_latency_ratio": 1.5, "min_windows": 2},
    )
    assert engine.claim() == rollout_id
    engine.step(rollout_id)
    with database.sessionmaker() as session, session.begin():
        rollout = session.get(Rollout, rollout_id)
        assert rollout is not None
        assert (rollout.status, rollout.phase) == ("running", "soak")
        (changed,) = [t for t in repository.targets(session, rollout_id) if t.status == "passed"]
        assert rollout.soak_until is not None
        soak_start = rollout.soak_until - timedelta(seconds=rollout.soak_seconds)
        batch = uuid.uuid4()
        session.add(TelemetryBatchRow(batch_id=batch, node_id=changed.node_id, windows=4))
        session.flush()
        for start, latency in ((-120, 80.0), (-60, 90.0), (1, 200.0), (2, 210.0)):
            at = soak_start + timedelta(seconds=start)
            session.add(
                TelemetryWindowRow(
                    device_id=changed.device_id,
                    batch_id=batch,
                    window_start=at,
                    window_end=at + timedelta(seconds=1 if start > 0 else 50),
                    read_ios=100,
                    write_ios=0,
                    read_bytes=409600,
                    write_bytes=0,
                    iops=100.0,
                    read_share=1.0,
                    mean_request_bytes=4096.0,
                    mean_latency_us=latency,
                    queue_depth=1.0,
                    utilisation=0.5,
                )
            )
    still = _drive(engine, rollout_id)
    assert still.status == "rolled_back", still.status_detail
    assert "mean latency 2.41x" in still.status_detail
    with database.sessionmaker() as session:
        statuses = _targets(session, rollout_id)
    assert sorted(statuses.values()) == ["pending", "rolled_back"]  # stage 2 never started


def test_stages_are_cumulative_node_counts() -> None:
    assert rollouts.plan_stages(["1", "10%", "50%", "100%"], 40) == [1, 4, 20, 40]
    assert rollouts.plan_stages(["1", "10%", "50%", "100%"], 3) == [1, 2, 3]
    assert rollouts.plan_stages(["100%"], 5) == [5]
    assert rollouts.plan_stages(["2", "100%"], 1) == [1]
    with pytest.raises(Unprocessable):
        rollouts.plan_stages(["1", "50%"], 4)


def test_a_canary_that_could_not_run_waits_for_an_operator() -> None:
    """`agent canary` exit 4 (no eBPF, too little traffic): no verdict, not a failure — the
    stage pauses with the reason the agent gave, as for a host the playbook did not reach."""
    from service.rollouts.ansible import CANARY_TASK, PlaybookRunner

    def item(rc: int, stderr: str = "") -> dict[str, Any]:
        return {
            "event": "runner_item_on_ok" if rc in (0, 3, 4) else "runner_item_on_failed",
            "event_data": {
                "task": CANARY_TASK,
                "host": "node-a",
                "res": {"item": "loop0", "rc": rc, "stdout": "", "stderr": stderr},
            },
        }

    found = PlaybookRunner._item_outcome(
        item(4, "could not run: loop0 had 12 I/Os in 10.0 s …"), "rollout.yml"
    )
    assert found is not None
    assert found.result == "not_run"
    assert "could not run" in found.detail
    assert PlaybookRunner._item_outcome(item(1), "rollout.yml").result == "fail"  # type: ignore[union-attr]
    assert PlaybookRunner._item_outcome(item(3), "rollout.yml").result == "inconclusive"  # type: ignore[union-attr]


def test_a_rollout_names_the_application_sli_its_canaries_judge(database: Database) -> None:
    """Targeted by node label (role=db, say), every node's canary reads its own exporter."""
    label = _fleet(database, 1)
    runner = ScriptedRunner()
    engine = Engine(database, runner)
    sli = {
        "url": "http://127.0.0.1:9187/metrics",
        "kind": "ratio",
        "metric": "pg_stat_wal_wal_sync_time",
        "per": "pg_stat_wal_wal_sync",
    }
    rollout_id = _start(database, label, canary={"sli": sli}, stages=["100%"])
    _drive(engine, rollout_id)
    sent = runner.extravars[0]["rollout_sli"]
    assert isinstance(sent, dict)
    assert (sent["metric"], sent["per"], sent["tolerance"]) == (sli["metric"], sli["per"], 0.1)
    plain = _start(database, _fleet(database, 1), stages=["100%"])
    _drive(engine, plain)
    assert runner.extravars[-1]["rollout_sli"] is None


def test_a_rollout_says_whether_its_application_is_closed_or_open_loop(database: Database) -> None:
    """Issue 65: whether a lower data rate under the candidate is harm is the policy's to say
    (closed: the device sets the pace; open: the clients do) or the canary's to tell (auto);
    the playbook passes it to every node's canary."""
    runner = ScriptedRunner()
    engine = Engine(database, runner)
    paced = _start(database, _fleet(database, 1), canary={"loop": "open"}, stages=["100%"])
    _drive(engine, paced)
    sent = [runner.extravars[-1]["rollout_loop"]]
    told = _start(database, _fleet(database, 1), stages=["100%"])
    _drive(engine, told)
    sent.append(runner.extravars[-1]["rollout_loop"])
    assert sent == ["open", "auto"]
    root = Path(__file__).resolve().parents[2]
    tasks = (root / "playbooks/roles/blkpilot_policy/tasks/main.yml").read_text()
    assert "'--loop', rollout_loop" in tasks


# --- accepting a recommendation: a one-device rollout (issue 66 item 1) and one-step undo -----


def _recommendation(database: Database, label: str) -> tuple[uuid.UUID, uuid.UUID]:
    """A proposed bfq recommendation for the fleet's one device; (its id, the device's)."""
    with database.sessionmaker() as session, session.begin():
        (target,) = repository.devices_with_nodes(
            session, device_class=None, node_labels={"fleet": label}, device_ids=[]
        )
        device = target[0]
        row = create_recommendation(
            session, device.id, DeviceConfig(scheduler=Scheduler.BFQ), "hs23-single-randread-4k-qd1"
        )
        return row.id, device.id


def _accept(database: Database, recommendation_id: uuid.UUID, **body: object) -> str:
    with database.sessionmaker() as session, session.begin():
        read = recommendations.accept(
            session,
            OPERATOR,
            recommendation_id,
            Acceptance.model_validate({"reason": "try it", "soak_seconds": 0, **body}),
        )
        return read.status


def _rollout_of(database: Database, recommendation_id: uuid.UUID) -> uuid.UUID:
    """The rollout verifying an accepted recommendation."""
    with database.sessionmaker() as session:
        row = session.get(RecommendationRow, recommendation_id)
        assert row is not None
        assert row.rollout_id is not None
        return row.rollout_id


def _status(database: Database, recommendation_id: uuid.UUID) -> tuple[str, Policy | None]:
    with database.sessionmaker() as session:
        row = session.get(RecommendationRow, recommendation_id)
        assert row is not None
        policy = session.scalars(select(Policy).where(Policy.device_id == row.device_id)).first()
        return row.status, policy


@pytest.mark.parametrize(
    ("canary", "ends", "status"),
    [
        ("pass", "succeeded", "kept"),
        ("fail", "rolled_back", "rolled_back"),
        ("inconclusive", "rolled_back", "rolled_back"),  # not kept unproven, by default
    ],
)
def test_an_accepted_recommendation_is_kept_only_if_its_canary_passes(
    database: Database, canary: Result, ends: str, status: str
) -> None:
    label = _fleet(database, 1)
    recommendation_id, _device_id = _recommendation(database, label)
    engine = Engine(database, ScriptedRunner({f"{label}-0": [canary]}))
    assert _accept(database, recommendation_id) == "verifying"
    assert _status(database, recommendation_id) == ("verifying", None)  # nothing pinned yet
    with database.sessionmaker() as session:
        row = session.get(RecommendationRow, recommendation_id)
        assert row is not None
        assert row.rollout_id is not None
        rollout_id = row.rollout_id
        assert session.get(Rollout, rollout_id).workload_name == "hs23-single-randread-4k-qd1"  # type: ignore[union-attr]
    done = _drive(engine, rollout_id)
    assert done.status == ends, done.status_detail
    found, policy = _status(database, recommendation_id)
    assert found == status
    if status == "kept":
        assert policy is not None
        assert policy.config["scheduler"] == "bfq"
    else:
        assert policy is None  # the device had none, and has none again
        assert engine.runner.calls[-1][0] == "rollback.yml"  # type: ignore[attr-defined]
    with database.sessionmaker() as session:
        actions = session.scalars(
            select(AuditEvent.action).where(AuditEvent.target_id == str(recommendation_id))
        ).all()
    assert actions == ["recommendation.accepted", f"recommendation.{status}"]


def test_an_inconclusive_canary_can_wait_for_an_operator_instead(database: Database) -> None:
    label = _fleet(database, 1)
    recommendation_id, _ = _recommendation(database, label)
    engine = Engine(database, ScriptedRunner({f"{label}-0": ["inconclusive"]}))
    _accept(database, recommendation_id, on_inconclusive="pause")
    rollout_id = _rollout_of(database, recommendation_id)
    assert _drive(engine, rollout_id).status == "paused"
    assert _status(database, recommendation_id)[0] == "verifying"


def test_revert_puts_a_kept_change_back_in_one_step(database: Database) -> None:
    label = _fleet(database, 1)
    recommendation_id, _ = _recommendation(database, label)
    engine = Engine(database, ScriptedRunner())
    _accept(database, recommendation_id)
    rollout_id = _rollout_of(database, recommendation_id)
    assert _drive(engine, rollout_id).status == "succeeded"
    assert _status(database, recommendation_id)[0] == "kept"
    with database.sessionmaker() as session, session.begin():
        assert recommendations.revert(session, OPERATOR, recommendation_id, "undo").status == (
            "reverted"
        )
    done = _drive(engine, rollout_id)
    assert done.status == "rolled_back"
    assert engine.runner.calls[-1][0] == "rollback.yml"  # type: ignore[attr-defined]
    found, policy = _status(database, recommendation_id)
    assert (found, policy) == ("reverted", None)  # unmanaged, as it was
    with database.sessionmaker() as session, session.begin(), pytest.raises(Conflict):
        recommendations.revert(session, OPERATOR, recommendation_id, "twice")


def test_applied_without_canary_is_audited_and_reverted_to_unmanaged(database: Database) -> None:
    """The explicit choice: pinned at once (audited as such). Its revert sets what the device
    ran before and, once the agent reports that applied, releases the device: unmanaged, as it
    was before its first policy."""
    label = _fleet(database, 1)
    recommendation_id, device_id = _recommendation(database, label)
    assert _accept(database, recommendation_id, without_canary=True) == "applied"
    found, policy = _status(database, recommendation_id)
    assert found == "applied"
    assert policy is not None
    assert policy.config["scheduler"] == "bfq"
    assert "without a canary" in policy.reason
    with database.sessionmaker() as session, session.begin():
        recommendations.revert(session, OPERATOR, recommendation_id, "undo")
    found, policy = _status(database, recommendation_id)
    assert found == "reverted"
    assert policy is not None
    assert policy.release_when_applied
    assert policy.version == 2
    before = policy.config
    with database.sessionmaker() as session, session.begin():
        device = session.get(Device, device_id)
        assert device is not None
        node = Principal(name="node", node_id=device.node_id)
        report = AppliedStateReport(
            policy_version=2,
            status=AppliedStatus.APPLIED,
            config=DeviceConfig.model_validate(before),
            detail="read back",
        )
        policy_service.report_applied(session, node, device_id, report)
    assert _status(database, recommendation_id) == ("reverted", None)
    with database.sessionmaker() as session:
        actions = session.scalars(
            select(AuditEvent.action)
            .where(AuditEvent.target_id == str(device_id))
            .order_by(AuditEvent.id)
        ).all()
    assert actions[-4:] == ["policy.set", "policy.reverted", "policy.applied", "policy.released"]


def test_a_kept_change_whose_rollout_an_operator_aborts_reads_rolled_back(
    database: Database,
) -> None:
    """Aborting the rollout itself after it succeeded puts the device back: its
    recommendation does not go on reading "kept"."""
    label = _fleet(database, 1)
    recommendation_id, _ = _recommendation(database, label)
    engine = Engine(database, ScriptedRunner())
    _accept(database, recommendation_id)
    rollout_id = _rollout_of(database, recommendation_id)
    assert _drive(engine, rollout_id).status == "succeeded"
    assert _status(database, recommendation_id)[0] == "kept"
    with database.sessionmaker() as session, session.begin():
        rollouts.abort(session, OPERATOR, rollout_id, "not on this box after all")
    assert _drive(engine, rollout_id).status == "rolled_back"
    assert _status(database, recommendation_id) == ("rolled_back", None)
