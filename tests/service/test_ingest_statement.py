"""A push as `serve` stores it: on a session of the engine's own (not a test's transaction),
the batch's claim and its windows go to PostgreSQL in one statement that commits on its own
(service.telemetry.repository.store_batch) — whole or not at all, and the pooled connection
handed back as transactional as it was lent.

On a database of its own: these pushes commit."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from agent.contract.wire import TelemetryBatch
from bench.copytext import window_rows
from service.errors import Conflict
from service.nodes.cache import NODES
from service.security import Principal
from service.tables import TelemetryBatchRow, TelemetryWindowRow
from service.telemetry import retention, service
from service.telemetry.retention import RetentionPolicy, maintain
from tests.conftest import upkeep_database
from tests.factories import (
    create_node,
    device_inventory,
    ebpf_window,
    report_inventory,
    telemetry_window,
)

NAME = "blkpilot_test_ingest_statement"


@pytest.fixture(scope="module")
def scratch(server_url: str) -> Iterator[Engine]:
    # one pooled connection: the one a push used is the one the next unit of work gets
    with upkeep_database(server_url, NAME, pool_size=1) as engine:
        maintain(engine, RetentionPolicy())  # the windows' day partitions, made ahead
        yield engine


@pytest.fixture
def node(scratch: Engine) -> Iterator[Principal]:
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        created, _ = create_node(session, hostname=f"n-{uuid.uuid4().hex[:8]}")
        report_inventory(session, created, device_inventory("loop0"), device_inventory("loop1"))
    yield Principal(name=f"node:{created.hostname}", node_id=created.id)
    NODES.clear()
    retention.CACHE.clear()


def _batch(*windows: dict[str, Any], batch_id: uuid.UUID | None = None) -> TelemetryBatch:
    return TelemetryBatch.model_validate(
        {"batch_id": str(batch_id or uuid.uuid4()), "windows": list(windows)}
    )


def _stored(engine: Engine, node: Principal) -> tuple[int, int]:
    """Windows and batch ids of the node's, as another connection sees them."""
    with Session(engine) as session:
        windows = session.scalar(
            select(func.count())
            .select_from(TelemetryWindowRow)
            .where(
                TelemetryWindowRow.batch_id.in_(
                    select(TelemetryBatchRow.batch_id).where(
                        TelemetryBatchRow.node_id == node.node_id
                    )
                )
            )
        )
        batches = session.scalar(
            select(func.count())
            .select_from(TelemetryBatchRow)
            .where(TelemetryBatchRow.node_id == node.node_id)
        )
    return windows or 0, batches or 0


def _push(engine: Engine, node: Principal, batch: TelemetryBatch, *, commit: bool = True) -> Any:
    with Session(engine, expire_on_commit=False) as session:
        receipt = service.ingest(session, node, batch)
        if commit:
            session.commit()
        else:
            session.rollback()
    return receipt


def test_a_push_with_nothing_else_to_do_commits_with_its_one_statement(
    scratch: Engine, node: Principal
) -> None:
    # the first push looks up the node's devices and the partitions: a transaction of its own
    _push(scratch, node, _batch(telemetry_window("loop0", index=0)))
    assert _stored(scratch, node) == (1, 1)
    # the next one has nothing to look up: its statement is the unit of work, committed when
    # it returns — a rollback after it undoes nothing (BEGIN ... COMMIT would have)
    second = _batch(telemetry_window("loop0", index=1), telemetry_window("loop1", index=1))
    receipt = _push(scratch, node, second, commit=False)
    assert (receipt.accepted, receipt.windows) == (True, 2)
    assert _stored(scratch, node) == (3, 2)


def test_the_connection_goes_back_to_the_pool_transactional(
    scratch: Engine, node: Principal
) -> None:
    _push(scratch, node, _batch(telemetry_window("loop0", index=0)))
    _push(scratch, node, _batch(telemetry_window("loop0", index=1)))
    # the pool's one connection, next lent to a unit of work that rolls back
    with Session(scratch) as session:
        session.execute(
            text("UPDATE nodes SET hostname = 'renamed' WHERE id = :id"), {"id": node.node_id}
        )
        session.rollback()
    with Session(scratch) as session:
        assert (
            session.scalar(text("SELECT hostname FROM nodes WHERE id = :id"), {"id": node.node_id})
            != "renamed"
        )


def test_a_window_stored_before_refuses_its_whole_batch_and_leaves_the_id_free(
    scratch: Engine, node: Principal
) -> None:
    _push(scratch, node, _batch(telemetry_window("loop0", index=0)))
    _push(scratch, node, _batch(telemetry_window("loop0", index=1)))  # caches warm
    retry = uuid.uuid4()
    clashing = _batch(
        telemetry_window("loop1", index=5), telemetry_window("loop0", index=0), batch_id=retry
    )
    with pytest.raises(Conflict, match="ingested before in another batch"):
        _push(scratch, node, clashing)
    assert _stored(scratch, node) == (2, 2)  # neither its new window nor its id
    # the id is free: the batch without the clash goes in under it, once
    fixed = _batch(telemetry_window("loop1", index=5), batch_id=retry)
    assert _push(scratch, node, fixed).accepted
    assert not _push(scratch, node, fixed).accepted  # resent: acknowledged, not stored
    assert _stored(scratch, node) == (3, 3)


def test_the_statement_stores_each_window_as_its_fields_say(
    scratch: Engine, node: Principal
) -> None:
    """The statement reads the windows' JSON with the table's own types: every column of every
    stored row is what the Python statement of a row (bench.copytext.window_rows) says —
    eBPF windows with their percentiles, diskstats windows without, power readings, text
    that needs escaping, empty lists stored as NULL."""
    batch = _batch(
        telemetry_window("loop0", index=0),
        ebpf_window("loop1", index=0),
        ebpf_window("loop0", index=1, latency_note='C:\\path\ttab\nline "q" \u00e9'),
        telemetry_window(
            "loop1",
            index=1,
            power_watts=17.123456789012345,
            energy_joules=1e-7,
            power_scope="cpu_package",
            power_source="rapl",
            power_readings=[
                {
                    "source": "rapl",
                    "zone": "zone\\with\tescapes",
                    "scope": "cpu_package",
                    "watts": 17.123456789012345,
                    "energy_joules": 1e-7,
                }
            ],
            cpu_utilisation=0.25,
            context_switches_per_s=1234.5,
        ),
    )
    assert _push(scratch, node, batch).accepted
    struct = service.BATCHES.from_model(batch)
    assert node.node_id is not None
    ids = NODES.devices(node.node_id)
    assert ids is not None
    expected = {(row["device_id"], row["window_start"]): row for row in window_rows(struct, ids)}
    with Session(scratch) as session:
        stored = session.execute(
            select(TelemetryWindowRow.__table__).where(
                TelemetryWindowRow.batch_id == batch.batch_id
            )
        ).mappings()
        found = {(row["device_id"], row["window_start"]): dict(row) for row in stored}
    assert found.keys() == expected.keys()
    assert sum(row["p99_us"] is not None for row in found.values()) == 2
    for key, row in expected.items():
        # JSON columns as the table gives them back: plain lists and dicts
        want = {**row, **{k: _plain(row[k]) for k in ("power_readings", "operations")}}
        assert found[key] == want


def _plain(value: Any) -> Any:
    return None if value is None else msgspec.json.decode(msgspec.json.encode(value))


@given(st.lists(st.sampled_from(["disk", "ebpf", "power"]), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_the_digest_of_the_one_encoding_is_the_batchs(kinds: list[str]) -> None:
    """encode_batch's digest, made from the windows' JSON the statement stores, is the
    digest of the batch's whole canonical JSON (batch_digest): a batch claimed by one is
    recognised by the other when it is resent."""
    made = {
        "disk": lambda i: telemetry_window(f"loop{i % 3}", index=i),
        "ebpf": lambda i: ebpf_window(f"loop{i % 3}", index=i),
        "power": lambda i: telemetry_window(
            f"loop{i % 3}", index=i, power_watts=3.5, power_scope="system"
        ),
    }
    batch = service.BATCHES.from_model(_batch(*(made[k](i) for i, k in enumerate(kinds))))
    ids = {f"loop{i}": uuid.uuid4() for i in range(3)}
    encoded = service.encode_batch(batch, ids)
    assert encoded.digest == service.batch_digest(batch)
    assert len(msgspec.json.decode(encoded.extra)) == len(batch.windows)
    assert len(encoded.p99s) == kinds.count("ebpf")
