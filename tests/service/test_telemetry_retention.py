"""Telemetry that stays bounded, on a database of its own (the upkeep commits and drops tables):
day partitions made ahead, closed hours rolled up with their histograms merged, a day rolled up
whole (late windows included) and dropped once it is past the raw retention, hourly rows kept
until theirs; workload mapping reads the hours once the raw windows are gone. Time is moved by
handing the upkeep a later clock, not waited for."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from agent.contract.wire import TelemetryBatch
from models import mapping
from service.errors import Unprocessable
from service.recommendations import repository as recommendations
from service.security import Principal
from service.tables import TelemetryBatchRow, TelemetryHourlyRow, TelemetryWindowRow
from service.telemetry import repository
from service.telemetry import service as telemetry
from service.telemetry.retention import MAINTENANCE_LOCK, RetentionPolicy, maintain
from tests.conftest import upkeep_database
from tests.factories import create_node, device_inventory, ebpf_window, report_inventory

NAME = "blkpilot_test_retention"
POLICY = RetentionPolicy(raw_days=14, hourly_days=400, ahead_days=3)


@pytest.fixture
def scratch(server_url: str) -> Iterator[Engine]:
    with upkeep_database(server_url, NAME, pool_size=2) as engine:
        yield engine


def _window(start: datetime, index: int) -> dict[str, Any]:
    window = ebpf_window("loop0", index=index)
    window["start"] = start.isoformat()
    window["end"] = (start + timedelta(seconds=10)).isoformat()
    return window


def _batch(windows: list[dict[str, Any]]) -> TelemetryBatch:
    import uuid

    return TelemetryBatch.model_validate({"batch_id": str(uuid.uuid4()), "windows": windows})


def test_days_roll_up_then_drop_and_hours_outlive_them(scratch: Engine) -> None:
    now = datetime.now(UTC)
    first = maintain(scratch, POLICY, now)
    assert first.ran
    with scratch.connect() as connection:
        days = {p.table for p in repository.partitions(connection, repository.RAW)}
    for offset in range(-POLICY.raw_days, POLICY.ahead_days + 1):
        assert repository.day_partition((now + timedelta(days=offset)).date()).table in days

    with Session(scratch, expire_on_commit=False) as session, session.begin():
        node, _ = create_node(session)
        (device,) = report_inventory(session, node, device_inventory("loop0"))
        principal = Principal(name="node:a", node_id=node.id)
        device_id = device.id
    # twelve windows across an hour boundary three days ago: six in each hour
    base = (now - timedelta(days=3)).replace(hour=10, minute=59, second=0, microsecond=0)
    windows = [_window(base + timedelta(seconds=10 * i), i) for i in range(12)]
    batch = _batch(windows)
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        assert telemetry.ingest(session, principal, batch, POLICY).accepted
    with (
        Session(scratch, expire_on_commit=False) as session,
        session.begin(),
    ):  # the same batch again: stored once
        assert not telemetry.ingest(session, principal, batch, POLICY).accepted

    rolled = maintain(scratch, POLICY, now)
    assert rolled.rolled_up >= 2
    hours = {h.hour: h for h in _hours(scratch)}
    ten, eleven = base.replace(minute=0), base.replace(minute=0) + timedelta(hours=1)
    assert (hours[ten].windows, hours[eleven].windows) == (6, 6)
    assert hours[ten].read_ios == 6 * windows[0]["read_ios"]
    assert hours[ten].seconds == pytest.approx(60.0)
    assert hours[ten].queue_depth_seconds / hours[ten].seconds == pytest.approx(1.2)
    merged = {o["op"]: o for o in hours[ten].operations or []}
    assert merged["read"]["count"] == 6 * windows[0]["read_ios"]
    assert sum(n for _, n in merged["read"]["device_ns"]) == merged["read"]["count"]
    assert merged["write"]["size_bytes"] == [[12, 6 * windows[0]["write_ios"]]]

    # a late window (a spool after an outage) lands in an hour already rolled up
    late = _window(base - timedelta(seconds=30), 99)
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        assert telemetry.ingest(session, principal, _batch([late]), POLICY).accepted

    # twenty days on: the day is past the raw retention — rolled up once more, whole, then gone
    later = now + timedelta(days=20)
    report = maintain(scratch, POLICY, later)
    assert repository.day_partition(base.date()).table in report.dropped
    with Session(scratch) as session:
        assert session.scalar(select(func.count()).select_from(TelemetryWindowRow)) == 0
        assert session.scalar(select(func.count()).select_from(TelemetryBatchRow)) == 0
        horizon = repository.raw_horizon(session)
        assert horizon == POLICY.raw_horizon(later)
    hours = {h.hour: h for h in _hours(scratch)}
    assert (hours[ten].windows, hours[eleven].windows) == (7, 6)
    assert {o["op"]: o for o in hours[ten].operations or []}["read"]["count"] == 7 * late[
        "read_ios"
    ]

    # workload mapping reads the hours where the raw windows are gone
    with Session(scratch) as session:
        shapes = recommendations.window_shapes(session, device_id, base - timedelta(hours=2))
    assert len(shapes) == 2
    shape = mapping.observed_shape(shapes)
    assert shape is not None
    assert shape.read_share == pytest.approx(0.8)
    assert shape.request_kib == pytest.approx(4.0)

    # a window from before the raw retention (at this clock) is refused, with the rest of its
    # batch
    old = [_window(now - timedelta(days=3), 0), _window(now - timedelta(days=20), 1)]
    with Session(scratch) as session, session.begin(), pytest.raises(Unprocessable, match="14"):
        telemetry.ingest(session, principal, _batch(old), POLICY)
    with Session(scratch) as session:
        assert session.scalar(select(func.count()).select_from(TelemetryWindowRow)) == 0

    # past the hourly retention, the month goes too
    gone = maintain(scratch, POLICY, now + timedelta(days=POLICY.hourly_days + 40))
    assert repository.month_partition(base.date()).table in gone.dropped
    assert _hours(scratch) == []


def test_ingest_makes_a_missing_day_and_one_upkeep_runs_at_a_time(scratch: Engine) -> None:
    now = datetime.now(UTC)
    maintain(scratch, POLICY, now)
    day = (now - timedelta(days=5)).date()
    with scratch.begin() as connection:
        connection.execute(text(f"DROP TABLE {repository.day_partition(day).table}"))
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        node, _ = create_node(session)
        report_inventory(session, node, device_inventory("loop0"))
        principal = Principal(name="node:a", node_id=node.id)
    start = datetime(day.year, day.month, day.day, 8, tzinfo=UTC)
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        receipt = telemetry.ingest(session, principal, _batch([_window(start, 0)]), POLICY)
    assert receipt.windows == 1
    with scratch.connect() as connection:
        tables = {p.table for p in repository.partitions(connection, repository.RAW)}
    assert repository.day_partition(day).table in tables

    # another replica's pass holds the lock: this one skips, and runs once it is released
    with scratch.connect() as other:
        assert repository.try_maintenance_lock(other, MAINTENANCE_LOCK)
        other.commit()
        assert not maintain(scratch, POLICY, now).ran
        repository.release_maintenance_lock(other, MAINTENANCE_LOCK)
        other.commit()
    assert maintain(scratch, POLICY, now).ran


def _hours(engine: Engine) -> list[TelemetryHourlyRow]:
    with Session(engine) as session:
        return list(session.scalars(select(TelemetryHourlyRow).order_by(TelemetryHourlyRow.hour)))


def test_a_poison_hour_is_set_aside_and_the_upkeep_moves_on(scratch: Engine) -> None:
    """An hour whose rows the database refuses (here a CHECK constraint of the test's own on
    the hourly table) made every pass fail on it: it is recorded, counted and moved past;
    later hours are rolled up; and when its day expires its raw windows are set aside and
    the day dropped."""
    now = datetime.now(UTC)
    maintain(scratch, POLICY, now)
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        node, _ = create_node(session)
        report_inventory(session, node, device_inventory("loop0"))
        principal = Principal(name="node:a", node_id=node.id)
    poisoned = (now - timedelta(days=2)).replace(hour=6, minute=0, second=0, microsecond=0)
    good = poisoned + timedelta(hours=3)
    windows = [_window(poisoned + timedelta(seconds=10 * i), i) for i in range(2)]
    windows.append(_window(good, 2))
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        assert telemetry.ingest(session, principal, _batch(windows), POLICY).accepted
    with scratch.begin() as connection:
        connection.execute(
            text(f"ALTER TABLE {repository.HOURLY} ADD CONSTRAINT poison CHECK (windows < 2)")
        )
    failed_before = _sample("blkpilot_telemetry_rollup_failed_hours_total")
    try:
        report = maintain(scratch, POLICY, now)
        assert report.failed_hours == [poisoned]
        assert _sample("blkpilot_telemetry_rollup_failed_hours_total") == failed_before + 1
        hours = {h.hour: h for h in _hours(scratch)}
        assert poisoned not in hours
        assert hours[good].windows == 1  # the later hour is rolled up all the same
        with Session(scratch) as session:
            (failure,) = repository.rollup_failures(session)
        assert failure.hour == poisoned
        assert "poison" in failure.error

        # the next pass does not try it again (nothing to retry until the day is dropped)
        assert maintain(scratch, POLICY, now).failed_hours == []

        # past the raw retention: tried once more, still fails, set aside; the day is dropped
        later = now + timedelta(days=20)
        report = maintain(scratch, POLICY, later)
        assert repository.day_partition(poisoned.date()).table in report.dropped
        assert report.failed_hours == [poisoned]
        assert report.windows_set_aside == 2
        with Session(scratch) as session:
            kept = session.execute(
                text(f"SELECT count(*) FROM {repository.SET_ASIDE}")  # noqa: S608
            ).scalar()
            assert kept == 2
            (failure,) = repository.rollup_failures(session)
            assert (failure.attempts, failure.windows_set_aside) == (2, 2)
            assert session.scalar(select(func.count()).select_from(TelemetryWindowRow)) == 0
    finally:
        with scratch.begin() as connection:
            connection.execute(
                text(f"ALTER TABLE {repository.HOURLY} DROP CONSTRAINT IF EXISTS poison")
            )


def test_one_devices_sums_past_bigint_cost_no_other_device_its_hour(scratch: Engine) -> None:
    """Issue 64: one node's windows whose sums pass BIGINT (stored before overlaps were
    refused, or past the contract's bounds) made the hour fail for every node. Its
    device-hour is now clamped into BIGINT, and another node's device in the same hour is
    rolled up exactly."""
    now = datetime.now(UTC)
    maintain(scratch, POLICY, now)
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        hostile, _ = create_node(session, hostname="hostile")
        report_inventory(session, hostile, device_inventory("loop0"))
        innocent, _ = create_node(session, hostname="innocent")
        report_inventory(session, innocent, device_inventory("loop0"))
    hour = (now - timedelta(days=2)).replace(hour=6, minute=0, second=0, microsecond=0)
    for node, count in ((hostile, 3), (innocent, 2)):
        principal = Principal(name=f"node:{node.hostname}", node_id=node.id)
        windows = [_window(hour + timedelta(seconds=10 * i), i) for i in range(count)]
        with Session(scratch, expire_on_commit=False) as session, session.begin():
            assert telemetry.ingest(session, principal, _batch(windows), POLICY).accepted
    with scratch.begin() as connection:
        connection.execute(
            text(
                f"UPDATE {repository.RAW} SET read_ios = 9223372036854775807,"  # noqa: S608
                " read_bytes = 9223372036854775807, energy_joules = 1e308,"
                " mean_latency_us = 1e308, queue_depth = 1e308"
                " WHERE device_id IN (SELECT id FROM devices WHERE node_id = :node)"
            ),
            {"node": hostile.id},
        )
        innocent_ios = connection.execute(
            text(
                f"SELECT sum(read_ios) FROM {repository.RAW}"  # noqa: S608
                " WHERE device_id IN (SELECT id FROM devices WHERE node_id = :node)"
            ),
            {"node": innocent.id},
        ).scalar()
    report = maintain(scratch, POLICY, now)
    assert report.failed_hours == []
    with Session(scratch) as session:
        owners: dict[Any, Any] = dict(
            session.execute(text("SELECT id, node_id FROM devices")).all()
        )
        rows = {owners[h.device_id]: h for h in session.scalars(select(TelemetryHourlyRow))}
    assert rows[innocent.id].windows == 2
    assert rows[innocent.id].read_ios == innocent_ios
    assert rows[hostile.id].windows == 3
    assert rows[hostile.id].read_ios == 2**63 - 1  # clamped, its own hour alone


def test_one_window_at_the_old_maximum_rolls_up(scratch: Engine) -> None:
    now = datetime.now(UTC)
    maintain(scratch, POLICY, now)
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        node, _ = create_node(session)
        report_inventory(session, node, device_inventory("loop0"))
        principal = Principal(name="node:a", node_id=node.id)
    start = (now - timedelta(days=2)).replace(hour=6, minute=0, second=0, microsecond=0)
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        telemetry.ingest(session, principal, _batch([_window(start, 0)]), POLICY)
    with scratch.begin() as connection:
        connection.execute(text(f"UPDATE {repository.RAW} SET read_ios = {2**63 - 1}"))  # noqa: S608
    report = maintain(scratch, POLICY, now)
    assert report.failed_hours == []
    assert {h.hour: h for h in _hours(scratch)}[start].read_ios == 9223372036854775807


def _sample(name: str) -> float:
    from service.ops.metrics import REGISTRY

    return REGISTRY.get_sample_value(name) or 0.0
