"""A device-hour's histograms merged in Python (service.telemetry.hourly) write what the SQL
merge they replace wrote — held side by side on the same raw windows, on a database of its
own — and a window whose stored histograms do not parse costs its own device-hour its
histograms, and nothing else."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from agent.contract import histograms
from agent.contract.wire import OperationLatency, TelemetryBatch
from service.security import Principal
from service.tables import TelemetryHourlyRow
from service.telemetry import hourly, repository
from service.telemetry import service as telemetry
from service.telemetry.retention import RetentionPolicy, maintain
from tests.conftest import upkeep_database
from tests.factories import create_node, device_inventory, ebpf_window, report_inventory

NAME = "blkpilot_test_hourly"
POLICY = RetentionPolicy(raw_days=14, hourly_days=400, ahead_days=3)
RAW, HOURLY = repository.RAW, repository.HOURLY

# what the roll-up ran before service.telemetry.hourly: each pair a row, grouped by slot
# (repository._MERGE_HISTOGRAMS at cd626f8, its UPDATE made a SELECT)
SQL_MERGE = f"""
WITH slots AS (
    SELECT w.device_id,
        date_trunc('hour', w.window_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
        o ->> 'op' AS op, k.kind, (p ->> 0)::int AS slot, sum((p ->> 1)::bigint) AS n
    FROM {RAW} w
    CROSS JOIN LATERAL jsonb_array_elements(w.operations::jsonb) AS o
    CROSS JOIN LATERAL (VALUES ('device_ns'), ('queue_ns'), ('size_bytes')) AS k(kind)
    CROSS JOIN LATERAL jsonb_array_elements(coalesce(o -> k.kind, '[]'::jsonb)) AS p
    WHERE w.operations IS NOT NULL AND w.window_start >= :low AND w.window_start < :high
    GROUP BY 1, 2, 3, 4, 5
), kinds AS (
    SELECT device_id, hour, op, kind,
        jsonb_agg(jsonb_build_array(slot, n) ORDER BY slot) AS histogram,
        sum(n) AS total
    FROM slots GROUP BY 1, 2, 3, 4
), ops AS (
    SELECT device_id, hour, op,
        jsonb_build_object('op', op,
            'count', max(total) FILTER (WHERE kind = 'device_ns'),
            'device_ns', coalesce(jsonb_object_agg(kind, histogram) -> 'device_ns', '[]'),
            'queue_ns', coalesce(jsonb_object_agg(kind, histogram) -> 'queue_ns', '[]'),
            'size_bytes', coalesce(jsonb_object_agg(kind, histogram) -> 'size_bytes', '[]'))
            AS operation
    FROM kinds GROUP BY 1, 2, 3
)
SELECT device_id, hour, jsonb_agg(operation ORDER BY op) AS operations
FROM ops GROUP BY 1, 2
"""  # noqa: S608


@pytest.fixture
def scratch(server_url: str) -> Iterator[Engine]:
    with upkeep_database(server_url, NAME, pool_size=2) as engine:
        yield engine


def _pairs(rng: random.Random, slots: int) -> list[list[int]]:
    chosen = sorted(rng.sample(range(slots), rng.choice([0, 1, 3, 40])))
    return [[slot, rng.randint(1, 10**9)] for slot in chosen]


def _operations(rng: random.Random) -> list[dict[str, Any]]:
    """What a stored window may hold: any of the operations, a kind empty or left out."""
    operations = []
    for op in rng.sample(["read", "write", "flush", "discard", "other"], rng.randint(0, 3)):
        operation: dict[str, Any] = {"op": op, "count": 1, "p50_us": 1.0}
        for kind, slots in zip(
            hourly.KINDS,
            (histograms.LATENCY_SLOTS, histograms.LATENCY_SLOTS, histograms.SIZE_SLOTS),
            strict=True,
        ):
            if rng.random() < 0.8:
                operation[kind] = _pairs(rng, slots)
        operations.append(operation)
    return operations


def _node(engine: Engine, devices: list[str]) -> Principal:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        node, _ = create_node(session)
        report_inventory(session, node, *(device_inventory(name) for name in devices))
        return Principal(name="node:a", node_id=node.id)


def _store(engine: Engine, principal: Principal, windows: list[dict[str, Any]]) -> None:
    batch = TelemetryBatch.model_validate({"batch_id": str(uuid.uuid4()), "windows": windows})
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert telemetry.ingest(session, principal, batch, POLICY).accepted


def _window(device: str, start: datetime, index: int) -> dict[str, Any]:
    window = ebpf_window(device, index=index)
    window["start"] = start.isoformat()
    window["end"] = (start + timedelta(seconds=10)).isoformat()
    return window


def test_the_python_merge_writes_what_the_sql_merge_did(scratch: Engine) -> None:
    now = datetime.now(UTC)
    maintain(scratch, POLICY, now)
    devices = ["loop0", "loop1", "loop2"]
    principal = _node(scratch, devices)
    base = (now - timedelta(days=2)).replace(hour=10, minute=50, second=0, microsecond=0)
    # three devices, 12 windows each across two hour boundaries (10:50 … 12:40)
    windows = [
        _window(device, base + timedelta(minutes=10 * i), i)
        for device in devices
        for i in range(12)
    ]
    _store(scratch, principal, windows)
    # each window's stored operations replaced by what a stored window may hold, more varied
    # than the contract's: the merge reads what is there
    rng = random.Random(36)
    with scratch.begin() as connection:
        keys = connection.execute(
            text(f"SELECT device_id, window_start FROM {RAW} ORDER BY 1, 2")  # noqa: S608
        ).all()
        assert len(keys) == 36
        for device_id, start in keys:
            connection.execute(
                text(
                    f"UPDATE {RAW} SET operations = CAST(:ops AS json)"  # noqa: S608
                    " WHERE device_id = :d AND window_start = :s"
                ),
                {"ops": json.dumps(_operations(rng)), "d": device_id, "s": start},
            )
    low, high = base.replace(minute=0), base.replace(minute=0) + timedelta(hours=3)
    with scratch.begin() as connection:
        expected = {
            (row.device_id, row.hour): row.operations
            for row in connection.execute(text(SQL_MERGE), {"low": low, "high": high})
        }
        written = repository.roll_up(connection, low, high).hours
    assert written == 9  # three devices, three hours
    with Session(scratch) as session:
        got = {
            (h.device_id, h.hour): h.operations for h in session.scalars(select(TelemetryHourlyRow))
        }
    assert len(got) == 9
    # a device-hour none of whose windows has a pair has no row in the SQL's result: NULL
    assert got == {key: expected.get(key) for key in got}
    assert len(expected) >= 7
    # and the data is not trivially alike: operations of several kinds, counts of several sizes
    ops = {o["op"] for operations in got.values() for o in operations or []}
    assert len(ops) >= 4
    assert any(o["count"] is None for operations in got.values() for o in operations or [])


def test_histograms_that_do_not_parse_cost_their_device_hour_its_histograms_alone(
    scratch: Engine,
) -> None:
    """One device's unreadable histograms stop neither another device's roll-up of the same
    hour nor its own sums: its hour is written without histograms, said and counted."""
    now = datetime.now(UTC)
    maintain(scratch, POLICY, now)
    principal = _node(scratch, ["loop0", "loop1"])
    hour = (now - timedelta(days=3)).replace(hour=4, minute=0, second=0, microsecond=0)
    _store(
        scratch,
        principal,
        [
            _window("loop0", hour, 0),
            _window("loop1", hour, 1),
            _window("loop0", hour + timedelta(minutes=5), 2),
        ],
    )
    with scratch.begin() as connection:
        connection.execute(
            text(
                f"UPDATE {RAW} SET operations = CAST(:ops AS json)"  # noqa: S608
                " WHERE window_start = :s"
                " AND device_id = (SELECT id FROM devices WHERE name = 'loop0')"
            ),
            {"ops": json.dumps([{"op": "read", "device_ns": [["12", 1]]}]), "s": hour},
        )
    report = maintain(scratch, POLICY, now)
    assert report.failed_hours == []
    with Session(scratch) as session:
        names: dict[Any, Any] = dict(session.execute(text("SELECT id, name FROM devices")).all())
        rows = {names[h.device_id]: h for h in session.scalars(select(TelemetryHourlyRow))}
        assert repository.rollup_failures(session) == []
    assert [(names[d], h) for d, h in report.unreadable] == [("loop0", hour)]
    assert rows["loop0"].windows == 2  # its sums are rolled up
    assert rows["loop0"].operations is None
    operations = rows["loop1"].operations  # the other device's hour, histograms and all
    assert operations
    assert operations[0]["op"] == "read"


def test_the_kinds_merged_are_the_contracts_histograms() -> None:
    assert set(hourly.KINDS) == OperationLatency._text_free_fields
    assert set(hourly.KINDS) <= set(OperationLatency.model_fields)
    assert set(hourly.StoredOperation.__struct_fields__) == {"op", *hourly.KINDS}


_PAIRS = st.lists(
    st.tuples(st.integers(0, histograms.SIZE_SLOTS - 1), st.integers(1, 10**12)), max_size=6
)


@settings(max_examples=200, deadline=None)
@given(
    windows=st.lists(
        st.lists(
            st.fixed_dictionaries(
                {"op": st.sampled_from(["read", "write", "flush"])},
                optional={kind: _PAIRS for kind in hourly.KINDS},
            ),
            max_size=3,
        ),
        max_size=6,
    )
)
def test_merge_hour_sums_each_slot_of_each_operation_and_kind(
    windows: list[list[dict[str, Any]]],
) -> None:
    merged = hourly.merge_hour(json.dumps(w) for w in windows)
    assert [o["op"] for o in merged] == sorted(o["op"] for o in merged)
    by_op = {o["op"]: o for o in merged}
    for op in ("read", "write", "flush"):
        sent = [o for w in windows for o in w if o["op"] == op]
        for kind in hourly.KINDS:
            expected = histograms.merge(o.get(kind, []) for o in sent)
            assert (by_op[op][kind] if op in by_op else []) == expected
        if op in by_op:
            device_ns = by_op[op]["device_ns"]
            assert by_op[op]["count"] == (sum(n for _, n in device_ns) if device_ns else None)
        else:  # left out only when none of its histograms has a pair
            assert not any(o.get(kind) for o in sent for kind in hourly.KINDS)
