"""The trigger-kept device counts (migration 0009) against a count of the devices themselves,
through everything that moves a device between keys: enrolment, policies set, applied and
cleared, scheduler changes, devices leaving and coming back, a node deleted with its devices,
and a scheduler change racing a completion change in two transactions."""

from __future__ import annotations

import threading
import time
import uuid

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from agent.contract.tunables import CompletionMode, DeviceConfig, Scheduler
from agent.contract.wire import AppliedStateReport, AppliedStatus, DeviceClass
from service.dashboard import repository as dashboard_repository
from service.devices import repository
from service.policies import service as policies
from service.security import Principal, Role
from service.tables import Device, Node
from tests.factories import create_node, device_inventory, report_inventory

OPERATOR = Principal(name="op", role=Role.OPERATOR)

LIVE = text(
    "SELECT d.device_class, coalesce(d.current_scheduler, 'unknown'),"
    " coalesce(coalesce(p.applied_config, p.config) ->> 'completion', 'interrupt'), count(*)"
    " FROM devices d LEFT JOIN policies p ON p.device_id = d.id WHERE d.present"
    " GROUP BY 1, 2, 3"
)


def _live(session: Session) -> dict[tuple[str, str, str], int]:
    return {(a, b, c): int(n) for a, b, c, n in session.execute(LIVE)}


def _kept(session: Session) -> dict[tuple[str, str, str], int]:
    return {(a, b, c): n for a, b, c, n in repository.counts(session)}


def _check(session: Session) -> dict[tuple[str, str, str], int]:
    session.flush()
    kept = _kept(session)
    assert kept == _live(session)
    return kept


def _applied(session: Session, node: Node, device: Device, config: DeviceConfig) -> None:
    version = policies.get_policy(session, OPERATOR, device.id).version
    principal = Principal(name=f"node:{node.hostname}", node_id=node.id)
    report = AppliedStateReport(policy_version=version, status=AppliedStatus.APPLIED, config=config)
    policies.report_applied(session, principal, device.id, report)


def _delete_node(session: Session, node_id: uuid.UUID) -> None:
    session.flush()
    for statement in (
        "DELETE FROM enrollment_tokens WHERE used_by_node_id = :id",
        "DELETE FROM nodes WHERE id = :id",
    ):
        session.execute(text(statement), {"id": node_id})
    session.expire_all()


def test_every_change_moves_a_device_between_keys(session: Session) -> None:
    before = _check(session)
    label = uuid.uuid4().hex[:6]
    a, _ = create_node(session, hostname=f"counts-a-{label}")
    b, _ = create_node(session, hostname=f"counts-b-{label}")
    a0, a1, a2 = report_inventory(
        session,
        a,
        device_inventory("nvme0n1", poll_queues=2),
        device_inventory("sda", device_class=DeviceClass.HDD, scheduler=Scheduler.MQ_DEADLINE),
        device_inventory("sdb", device_class=DeviceClass.HDD, scheduler=Scheduler.BFQ),
    )
    (b0,) = report_inventory(session, b, device_inventory("nvme0n1", poll_queues=2))
    after = _check(session)
    assert sum(after.values()) == sum(before.values()) + 4

    # a desired completion mode counts until the agent reports what it applied
    polled = DeviceConfig(completion=CompletionMode.CLASSIC_POLL)
    policies.set_policy(session, OPERATOR, a0.id, polled, "poll it")
    policies.set_policy(session, OPERATOR, b0.id, polled, "poll it")
    kept = _check(session)
    assert kept[(DeviceClass.ULL.value, "none", "classic_poll")] >= 2

    # the agent applied a scheduler too, and could not poll: both move in one transaction
    _applied(session, a, a0, DeviceConfig(scheduler=Scheduler.KYBER))
    _check(session)
    policies.set_policy(session, OPERATOR, a1.id, DeviceConfig(scheduler=Scheduler.NONE), "x")
    _applied(
        session, a, a1, DeviceConfig(scheduler=Scheduler.NONE, completion=CompletionMode.INTERRUPT)
    )
    _check(session)

    # a device leaves (its policy stays), then comes back with another scheduler
    report_inventory(
        session, a, device_inventory("nvme0n1", poll_queues=2), device_inventory("sda")
    )
    assert not a2.present
    _check(session)
    report_inventory(
        session,
        a,
        device_inventory("nvme0n1", poll_queues=2),
        device_inventory("sda"),
        device_inventory("sdb", device_class=DeviceClass.HDD, scheduler=Scheduler.KYBER),
    )
    _check(session)

    policies.clear_policy(session, OPERATOR, b0.id, "back to interrupts")
    _check(session)

    # a node deleted takes its devices and their policies (cascades)
    _delete_node(session, a.id)
    _check(session)
    _delete_node(session, b.id)
    assert _check(session) == before


def test_folding_keeps_the_sums_and_leaves_a_row_per_key(session: Session) -> None:
    label = uuid.uuid4().hex[:6]
    node, _ = create_node(session, hostname=f"fold-{label}")
    names = [f"loop{i}" for i in range(6)]
    report_inventory(session, node, *(device_inventory(n) for n in names))
    report_inventory(
        session, node, *(device_inventory(n, scheduler=Scheduler.KYBER) for n in names)
    )
    kept = _check(session)
    removed = repository.fold_counts(session.connection())
    assert removed >= 12  # six +1 rows, six -1 and six +1 of the move fold into one each
    assert _check(session) == kept
    assert repository.fold_counts(session.connection()) == 0


def test_fleet_page_and_metrics_read_the_counts(session: Session) -> None:
    label = uuid.uuid4().hex[:6]
    node, _ = create_node(session, hostname=f"page-{label}")
    before = dashboard_repository.fleet_counts(session)
    report_inventory(
        session, node, device_inventory("sda", device_class=DeviceClass.HDD), device_inventory()
    )
    session.flush()
    counts = dashboard_repository.fleet_counts(session)
    assert counts["classes"]["hdd"] == before["classes"].get("hdd", 0) + 1
    assert sum(counts["completions"].values()) == sum(before["completions"].values()) + 2


def test_a_scheduler_change_racing_a_completion_change_is_counted_once(engine: Engine) -> None:
    """Each trigger reads the other table: without the device row lock the policy's trigger
    takes, both would count from the state before either committed (write skew)."""
    label = uuid.uuid4().hex[:6]
    with Session(engine) as setup:
        node, _ = create_node(setup, hostname=f"race-{label}")
        (device,) = report_inventory(setup, node, device_inventory("nvme0n1", poll_queues=1))
        polled = DeviceConfig(completion=CompletionMode.CLASSIC_POLL)
        policies.set_policy(setup, OPERATOR, device.id, polled, "poll it")
        setup.commit()
        node_id, device_id = node.id, device.id
    try:
        first = Session(engine)
        first.execute(
            text("UPDATE devices SET current_scheduler = 'kyber' WHERE id = :id"),
            {"id": device_id},
        )
        finished = threading.Event()

        def second() -> None:
            with Session(engine) as other:
                other.execute(
                    text(
                        'UPDATE policies SET config = \'{"completion": "interrupt"}\''
                        " WHERE device_id = :id"
                    ),
                    {"id": device_id},
                )
                other.commit()
            finished.set()

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)
        assert not finished.is_set()  # waits for the device row
        first.commit()
        first.close()
        thread.join(10)
        assert finished.is_set()
        with Session(engine) as check:
            assert _kept(check) == _live(check)
    finally:
        with Session(engine) as cleanup:
            _delete_node(cleanup, node_id)
            cleanup.commit()
