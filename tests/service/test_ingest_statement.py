"""A push as `serve` stores it: on a session of the engine's own (not a test's transaction),
the batch's claim and its windows go to PostgreSQL in one statement that commits on its own
(service.telemetry.repository.store_batch) — whole or not at all, and the pooled connection
handed back as transactional as it was lent.

On a database of its own: these pushes commit."""

from __future__ import annotations

import json
import math
import struct
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

from agent.contract.wire import TelemetryBatch, TelemetryWindow
from bench.copytext import window_rows
from service.app import create_app
from service.db import PUSHES_APPLICATION, Database
from service.errors import Conflict
from service.nodes.cache import NODES
from service.ops.metrics import REGISTRY
from service.security import Principal
from service.settings import Settings
from service.tables import TelemetryBatchRow, TelemetryWindowRow
from service.telemetry import columns, retention, service
from service.telemetry.retention import RetentionPolicy, maintain
from tests.conftest import upkeep_database
from tests.factories import (
    bearer,
    create_node,
    device_inventory,
    ebpf_window,
    rapl_window,
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


@pytest.mark.parametrize("earlier", [0, 1], ids=["canonical JSON", "pydantic JSON"])
def test_a_batch_claimed_under_an_earlier_digest_is_known_when_resent(
    scratch: Engine, node: Principal, earlier: int
) -> None:
    """A batch claimed by this service before its digest was made from the arrays (its
    canonical JSON's, or pydantic's before that) and resent by a spool now is acknowledged,
    not refused; other content under its id is still refused whole."""
    batch = _batch(telemetry_window("loop0", index=0), ebpf_window("loop1", index=0))
    assert _push(scratch, node, batch).accepted
    digests = list(service.earlier_digests(service.BATCHES.from_model(batch)))
    assert digests[earlier] != service.batch_digest(service.BATCHES.from_model(batch))
    with Session(scratch) as session, session.begin():
        session.execute(
            text("UPDATE telemetry_batches SET digest = :digest WHERE batch_id = :batch_id"),
            {"digest": digests[earlier], "batch_id": batch.batch_id},
        )
    assert not _push(scratch, node, batch).accepted
    other = _batch(telemetry_window("loop0", index=3), batch_id=batch.batch_id)
    with pytest.raises(Conflict, match="other content"):
        _push(scratch, node, other)
    assert _windows_of(scratch, batch) == 2


def test_the_statement_stores_each_window_as_its_fields_say(
    scratch: Engine, node: Principal
) -> None:
    """The statement reads the windows' binary arrays with the table's own types: every column
    of every stored row is what the Python statement of a row (bench.copytext.window_rows) says —
    eBPF windows with their percentiles, diskstats windows without, power readings, text
    that needs escaping, empty lists stored as NULL."""
    batch = _batch(
        telemetry_window("loop0", index=0),
        ebpf_window("loop1", index=0),
        ebpf_window("loop0", index=1, latency_note='C:\\path\ttab\nline "q" \u00e9'),
        rapl_window(
            "loop1",
            index=1,
            zone="zone\\with\tescapes",
            cpu_utilisation=0.25,
            context_switches_per_s=1234.5,
        ),
    )
    assert _push(scratch, node, batch).accepted
    found = _stored_as_its_fields_say(scratch, batch)
    assert sum(row["p99_us"] is not None for row in found) == 2


def _stored_as_its_fields_say(engine: Engine, batch: TelemetryBatch) -> list[dict[str, Any]]:
    """The batch's stored rows, each held to the row bench.copytext.window_rows writes out
    for its window (the device ids from the node's cached map)."""
    with Session(engine) as session:
        stored = session.execute(
            select(TelemetryWindowRow.__table__).where(
                TelemetryWindowRow.batch_id == batch.batch_id
            )
        ).mappings()
        found = {(row["device_id"], row["window_start"]): dict(row) for row in stored}
        node_id = session.scalar(
            select(TelemetryBatchRow.node_id).where(TelemetryBatchRow.batch_id == batch.batch_id)
        )
    assert node_id is not None
    ids = NODES.devices(node_id)
    assert ids is not None
    rows = window_rows(service.BATCHES.from_model(batch), ids)
    expected = {(row["device_id"], row["window_start"]): row for row in rows}
    assert found.keys() == expected.keys()
    for key, row in expected.items():
        # JSON columns as the table gives them back: plain lists and dicts
        want = {**row, **{k: _plain(row[k]) for k in ("power_readings", "operations")}}
        assert found[key] == want
    return list(found.values())


def _windows_of(engine: Engine, batch: TelemetryBatch) -> int:
    with Session(engine) as session:
        return (
            session.scalar(
                select(func.count())
                .select_from(TelemetryWindowRow)
                .where(TelemetryWindowRow.batch_id == batch.batch_id)
            )
            or 0
        )


def _plain(value: Any) -> Any:
    return None if value is None else msgspec.json.decode(msgspec.json.encode(value))


@given(st.lists(st.sampled_from(["disk", "ebpf", "power"]), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_the_digest_of_the_one_encoding_is_the_batchs(kinds: list[str]) -> None:
    """encode_batch's digest, made from the arrays the statement stores, is batch_digest's,
    whatever the node's device ids: a batch claimed by one is recognised by the other when it
    is resent. A window's value changed by one changes it."""
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
    assert encoded.stored.digest == service.batch_digest(batch)
    changed = msgspec.structs.replace(batch.windows[-1], write_ios=batch.windows[-1].write_ios + 1)
    other = msgspec.structs.replace(batch, windows=[*batch.windows[:-1], changed])
    assert service.batch_digest(other) != encoded.stored.digest
    assert encoded.stored.count == len(batch.windows)
    assert encoded.stored.arrays.keys() == {c.name for c in columns.COLUMNS}
    assert len(encoded.p99s) == kinds.count("ebpf")


@given(st.lists(st.sampled_from(["disk", "ebpf", "power", "note"]), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_each_columns_array_holds_its_windows_values_in_order(kinds: list[str]) -> None:
    """columns.encode, read back as PostgreSQL's array_recv reads it: each column's array holds
    the value of the row bench.copytext.window_rows writes for each window, in the windows'
    order — alike or mixed, NULLs included (a batch all of diskstats windows, whose arrays are
    written once and repeated, as much as one of every kind)."""
    made = {
        "disk": lambda i: telemetry_window(f"loop{i % 3}", index=i),
        "ebpf": lambda i: ebpf_window(f"loop{i % 3}", index=i),
        "power": lambda i: rapl_window(f"loop{i % 3}", index=i, cpu_utilisation=0.5),
        "note": lambda i: telemetry_window(f"loop{i % 3}", index=i, latency_note=f"n\t{i}\u00e9"),
    }
    batch = service.BATCHES.from_model(_batch(*(made[k](i) for i, k in enumerate(kinds))))
    ids = {f"loop{i}": uuid.uuid4() for i in range(3)}
    encoded = service.encode_batch(batch, ids).stored
    arrays = encoded.arrays
    rows = window_rows(batch, ids)
    for column in columns.COLUMNS:
        expected = [row[column.name] for row in rows]
        if column.kind in ("json", "jsonb"):
            expected = [_plain(value) for value in expected]
        assert _array_values(column.kind, arrays[column.name]) == expected, column.name


def test_integers_are_sent_as_doubles_only_where_the_contract_bounds_them() -> None:
    """The integer columns are read as doubles (columns.encode): a field is allowed only if its
    bounds keep it within 2**53, where a double holds every integer; a field without bounds
    is not."""
    assert all(columns._exact_as_double(c.field) for c in columns._INTS)  # type: ignore[arg-type]
    assert {c.name for c in columns._INTS} == {"read_ios", "write_ios", "read_bytes", "write_bytes"}
    assert not columns._exact_as_double("latency_note")  # no bounds
    assert TelemetryWindow.model_fields["read_bytes"].metadata  # the bounds it is judged by


def _array_values(kind: str, data: bytes) -> list[Any]:
    """A one-dimensional binary array's elements, as array_recv reads them."""
    dimensions, _, element_oid, count, lower = struct.unpack_from(">iiiii", data)
    assert (dimensions, element_oid, lower) == (1, columns.OIDS[kind][0], 1)
    values: list[Any] = []
    offset = 20
    for _ in range(count):
        (length,) = struct.unpack_from(">i", data, offset)
        offset += 4
        if length == -1:
            values.append(None)
            continue
        raw, offset = data[offset : offset + length], offset + length
        if kind == "int8":
            values.append(struct.unpack(">q", raw)[0])
        elif kind == "float8":
            value = struct.unpack(">d", raw)[0]
            values.append(None if math.isnan(value) else value)  # the statement's nullif
        elif kind == "timestamptz":
            since = timedelta(microseconds=struct.unpack(">q", raw)[0])
            values.append(datetime(2000, 1, 1, tzinfo=UTC) + since)
        elif kind == "uuid":
            values.append(uuid.UUID(bytes=raw))
        elif kind == "text":
            values.append(raw.decode())
        else:  # json, and jsonb after its version byte
            values.append(msgspec.json.decode(raw[1:] if kind == "jsonb" else raw))
    assert offset == len(data)
    return values


# --- the push on the event loop (service.telemetry.service.ingest_pushed) -----------------


@pytest.fixture
def served(scratch: Engine, tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    """The application on the scratch database as `serve` runs it: its lifespan (the push
    connections open) and no session override — a node's token to push with."""
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        created, token = create_node(session, hostname=f"n-{uuid.uuid4().hex[:8]}")
        report_inventory(session, created, device_inventory("loop0"), device_inventory("loop1"))
    url = scratch.url.render_as_string(hide_password=False)
    app = create_app(Settings(database_url=url, data_dir=tmp_path), Database(scratch))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, token
    NODES.clear()
    retention.CACHE.clear()


def _paths() -> dict[str, float]:
    return {
        path: REGISTRY.get_sample_value("blkpilot_telemetry_push_path_total", {"path": path}) or 0.0
        for path in ("event_loop", "unit_of_work", "connection_failed")
    }


def _post(client: TestClient, token: str, batch: TelemetryBatch) -> Any:
    return client.post(
        "/api/v1/telemetry/batches", content=batch.model_dump_json(), headers=_json(token)
    )


def _json(token: str) -> dict[str, str]:
    return {**bearer(token), "content-type": "application/json"}


def _moved(before: dict[str, float]) -> dict[str, float]:
    return {path: count - before[path] for path, count in _paths().items() if count != before[path]}


def test_a_push_the_caches_answer_is_stored_on_the_event_loop(
    scratch: Engine, served: tuple[TestClient, str]
) -> None:
    """A node's first push looks its devices and the days' partitions up in a unit of work;
    the next is one statement on the event loop, and stores each window as its fields say."""
    client, token = served
    before = _paths()
    first = _post(client, token, _batch(telemetry_window("loop0", index=0)))
    assert first.status_code == 201, first.text
    assert _moved(before) == {"unit_of_work": 1}
    batch = _batch(
        ebpf_window("loop0", index=1),
        ebpf_window("loop1", index=1, latency_note="tab\there \u00e9"),
        telemetry_window("loop1", index=2, power_watts=2.5, power_scope="system"),
    )
    before = _paths()
    second = _post(client, token, batch)
    assert second.status_code == 201, second.text
    assert second.json() == {"batch_id": str(batch.batch_id), "accepted": True, "windows": 3}
    assert _moved(before) == {"event_loop": 1}
    assert len(_stored_as_its_fields_say(scratch, batch)) == 3


def test_a_resent_push_is_acknowledged_and_a_clash_refused_whole(
    scratch: Engine, served: tuple[TestClient, str]
) -> None:
    """What the event loop's statement cannot settle — an id claimed before, a window stored
    before under another batch — the unit of work answers, as it always did."""
    client, token = served
    assert _post(client, token, _batch(telemetry_window("loop0", index=0))).status_code == 201
    batch = _batch(telemetry_window("loop0", index=1), telemetry_window("loop1", index=1))
    assert _post(client, token, batch).status_code == 201
    before = _paths()
    again = _post(client, token, batch)
    assert again.status_code == 200, again.text
    assert again.json()["accepted"] is False
    assert _moved(before) == {"unit_of_work": 1}
    clash = _batch(telemetry_window("loop1", index=7), telemetry_window("loop0", index=1))
    refused = _post(client, token, clash)
    assert refused.status_code == 409, refused.text
    assert "ingested before in another batch" in refused.json()["detail"]
    with Session(scratch) as session:
        claimed = session.scalar(
            select(func.count())
            .select_from(TelemetryBatchRow)
            .where(TelemetryBatchRow.batch_id == clash.batch_id)
        )
    assert (claimed, _windows_of(scratch, clash)) == (0, 0)  # the id free, nothing stored
    assert _windows_of(scratch, batch) == 2


def test_refusals_are_the_unit_of_works_with_their_reasons(
    scratch: Engine, served: tuple[TestClient, str]
) -> None:
    client, token = served
    assert _post(client, token, _batch(telemetry_window("loop0", index=0))).status_code == 201
    unknown = _post(client, token, _batch(telemetry_window("sdz", index=1)))
    assert unknown.status_code == 422
    assert "not reported in its inventory" in unknown.json()["detail"]
    future = telemetry_window("loop0", index=1)
    future["start"], future["end"] = "2099-01-01T00:00:00Z", "2099-01-01T00:00:10Z"
    refused = _post(client, token, _batch(future))
    assert refused.status_code == 422
    assert "end in the future" in refused.json()["detail"]
    # the event loop's statement does not look for it: the primary key refuses the second
    # window, the statement (claim and all) stores nothing, and the unit of work says why
    doubled = _batch(telemetry_window("loop0", index=3), telemetry_window("loop0", index=3))
    before = _paths()
    twice = _post(client, token, doubled)
    assert twice.status_code == 422
    assert "same device and interval twice" in twice.json()["detail"]
    assert _moved(before) == {"unit_of_work": 1}
    assert _windows_of(scratch, doubled) == 0
    # its id was not claimed: the batch sent again as it should be is stored
    doubled.windows.pop()
    assert _post(client, token, doubled).status_code == 201
    assert _windows_of(scratch, doubled) == 1


def test_a_push_whose_connection_broke_is_taken_in_a_unit_of_work(
    scratch: Engine, served: tuple[TestClient, str]
) -> None:
    """PostgreSQL ended the push connections (a restart, an idle timeout): the next push's
    statement fails before it commits anything, and the push is stored in a unit of work."""
    client, token = served
    assert _post(client, token, _batch(telemetry_window("loop0", index=0))).status_code == 201
    assert _post(client, token, _batch(telemetry_window("loop0", index=1))).status_code == 201
    with scratch.connect() as connection:
        ended = connection.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = :name AND datname = current_database()"
            ),
            {"name": PUSHES_APPLICATION},
        ).scalar()
        connection.commit()
    assert ended == 1  # the one connection the event loop's push used
    before = _paths()
    batch = _batch(telemetry_window("loop0", index=2), telemetry_window("loop1", index=2))
    pushed = _post(client, token, batch)
    assert pushed.status_code == 201, pushed.text
    assert _moved(before) == {"connection_failed": 1, "unit_of_work": 1}
    assert _windows_of(scratch, batch) == 2
    # and the next one is on the event loop again, on a new connection
    before = _paths()
    assert _post(client, token, _batch(telemetry_window("loop0", index=3))).status_code == 201
    assert _moved(before) == {"event_loop": 1}


def _lean() -> dict[str, float]:
    outcomes = ("answered", "token_not_held", "not_json", "model_judges", "unit_of_work")
    return {
        outcome: REGISTRY.get_sample_value(
            "blkpilot_telemetry_push_lean_total", {"outcome": outcome}
        )
        or 0.0
        for outcome in outcomes
    }


def _lean_moved(before: dict[str, float]) -> dict[str, float]:
    return {k: count - before[k] for k, count in _lean().items() if count != before[k]}


def _served_push(client: TestClient) -> float:
    return (
        REGISTRY.get_sample_value(
            "blkpilot_http_requests_total",
            {"method": "POST", "route": "/api/v1/telemetry/batches", "status": "201"},
        )
        or 0.0
    )


def test_the_lean_path_answers_a_held_push_as_the_route_does(
    scratch: Engine, served: tuple[TestClient, str]
) -> None:
    """A push from a node this process knows, on days it knows, is answered by the lean path
    (service.telemetry.fastpath) — stored on the event loop, answered with the route's
    receipt, observed under the route's template with a request id; the node's first push,
    whose devices are not known yet, is the route's."""
    client, token = served
    before, observed = _lean(), _served_push(client)
    first = _batch(telemetry_window("loop0", index=0))
    by_route = _post(client, token, first)
    assert by_route.status_code == 201, by_route.text
    assert _lean_moved(before) == {"unit_of_work": 1}
    before, paths = _lean(), _paths()
    second = _batch(ebpf_window("loop0", index=1), ebpf_window("loop1", index=1))
    lean = _post(client, token, second)
    assert lean.status_code == 201, lean.text
    assert _lean_moved(before) == {"answered": 1}
    assert _moved(paths) == {"event_loop": 1}
    assert _windows_of(scratch, second) == 2
    assert lean.headers["content-type"] == by_route.headers["content-type"]
    assert lean.headers["x-request-id"]
    assert lean.json() == {"batch_id": str(second.batch_id), "accepted": True, "windows": 2}
    assert by_route.json() == {"batch_id": str(first.batch_id), "accepted": True, "windows": 1}
    assert _served_push(client) == observed + 2  # both under the route's template


def test_what_the_lean_path_does_not_answer_is_the_routes(
    scratch: Engine, served: tuple[TestClient, str]
) -> None:
    """Each push the lean path hands on is answered by the route as before, from the body the
    lean path read and replayed: a resent batch id, another media type, a token it does not
    hold, a body only the model can judge (histograms not written compact: stored all the
    same) and one the model refuses."""
    client, token = served
    batch = _batch(telemetry_window("loop0", index=0))
    assert _post(client, token, batch).status_code == 201
    before = _lean()
    assert _post(client, token, _batch(telemetry_window("loop0", index=1))).status_code == 201
    assert _lean_moved(before) == {"answered": 1}

    before = _lean()
    again = _post(client, token, batch)
    assert (again.status_code, again.json()["accepted"]) == (200, False)
    assert _lean_moved(before) == {"unit_of_work": 1}

    before = _lean()
    plain = client.post(
        "/api/v1/telemetry/batches",
        content=batch.model_dump_json(),
        headers={**bearer(token), "content-type": "text/plain"},
    )
    assert plain.status_code == 415, plain.text
    assert _lean_moved(before) == {"not_json": 1}

    before = _lean()
    stranger = _post(client, "bpn_" + "0" * 40, _batch(telemetry_window("loop0", index=2)))
    assert stranger.status_code == 401, stranger.text
    assert _lean_moved(before) == {"token_not_held": 1}

    before = _lean()
    spaced = _batch(ebpf_window("loop0", index=3), ebpf_window("loop1", index=3))
    body = json.dumps(spaced.model_dump(mode="json"))  # ", " and ": " inside the histograms
    judged = client.post("/api/v1/telemetry/batches", content=body, headers=_json(token))
    assert judged.status_code == 201, judged.text
    assert _lean_moved(before) == {"model_judges": 1}
    assert _windows_of(scratch, spaced) == 2

    before = _lean()
    refused = telemetry_window("loop0", index=4, read_share=1.5)
    wrong = client.post(
        "/api/v1/telemetry/batches",
        content=json.dumps({"batch_id": str(uuid.uuid4()), "windows": [refused]}),
        headers=_json(token),
    )
    assert wrong.status_code == 422, wrong.text
    assert wrong.json()["fields"][0]["loc"][:4] == ["body", "windows", 0, "read_share"]
    assert _lean_moved(before) == {"model_judges": 1}


def test_a_push_past_the_size_limit_is_refused_at_the_lean_path_too(
    scratch: Engine, tmp_path: Path
) -> None:
    """The lean path reads the body through the size limit's receive: a push sent without a
    length (chunked) that passes the limit is answered 413, and nothing is stored."""
    with Session(scratch, expire_on_commit=False) as session, session.begin():
        created, token = create_node(session, hostname=f"n-{uuid.uuid4().hex[:8]}")
        report_inventory(session, created, device_inventory("loop0"))
    url = scratch.url.render_as_string(hide_password=False)
    settings = Settings(database_url=url, data_dir=tmp_path, max_request_bytes=4096)
    try:
        with TestClient(create_app(settings, Database(scratch))) as client:
            assert _post(client, token, _batch(telemetry_window("loop0", index=0))).status_code
            big = _batch(*(telemetry_window("loop0", index=i) for i in range(1, 40)))
            body = big.model_dump_json().encode()
            before = _lean()

            def chunks() -> Iterator[bytes]:
                for at in range(0, len(body), 1024):
                    yield body[at : at + 1024]

            refused = client.post(
                "/api/v1/telemetry/batches", content=chunks(), headers=_json(token)
            )
            assert refused.status_code == 413, refused.text
            assert _lean() == before  # neither answered nor handed on
            assert _windows_of(scratch, big) == 0
    finally:
        NODES.clear()
        retention.CACHE.clear()


# --- issue 64: what one node can send ---------------------------------------------------------


def _at(device: str, start: timedelta, span: timedelta, index: int = 0) -> dict[str, Any]:
    window = telemetry_window(device, index=index)
    begin = datetime.fromisoformat(telemetry_window(device, index=0)["start"]) + start
    window["start"], window["end"] = begin.isoformat(), (begin + span).isoformat()
    return window


def test_a_window_overlapping_another_of_its_device_is_refused_by_name(
    scratch: Engine, served: tuple[TestClient, str]
) -> None:
    """A device's windows may not overlap — stored before (409) or in the same batch (422),
    on the lean path and in the unit of work alike — or its counters are counted twice and
    an hour's sums leave BIGINT: the hostile tester's 1 h windows 10 ms apart are refused
    after the first. Windows that only touch, and another device's, are stored."""
    client, token = served
    ten = timedelta(seconds=10)
    assert _post(client, token, _batch(_at("loop0", timedelta(0), ten))).status_code == 201
    assert _post(client, token, _batch(_at("loop0", ten, ten))).status_code == 201  # caches warm

    for sent in (_batch(_at("loop0", timedelta(seconds=5), ten)), _batch(_at("loop0", ten, ten))):
        refused = _post(client, token, sent)
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert "loop0" in detail
        assert "overlaps a window stored before" in detail or "ingested before" in detail
        assert _windows_of(scratch, sent) == 0
    touching = _batch(_at("loop0", 2 * ten, ten), _at("loop1", timedelta(seconds=5), ten))
    assert _post(client, token, touching).status_code == 201
    assert _windows_of(scratch, touching) == 2

    inside = _batch(
        _at("loop1", timedelta(minutes=5), ten),
        _at("loop0", timedelta(minutes=5), ten),
        _at("loop0", timedelta(minutes=5, seconds=9), ten),
    )
    refused = _post(client, token, inside)
    assert refused.status_code == 422, refused.text
    assert "overlaps another window of this batch" in refused.json()["detail"]
    assert _windows_of(scratch, inside) == 0

    hour, apart = timedelta(hours=1), timedelta(milliseconds=10)
    first = _batch(_at("loop1", timedelta(minutes=10), hour))
    assert _post(client, token, first).status_code == 201
    hostile = _batch(*(_at("loop1", timedelta(minutes=10) + apart * i, hour) for i in (1, 2)))
    assert _post(client, token, hostile).status_code in (409, 422)
    later = _batch(_at("loop1", timedelta(minutes=10) + apart, hour))
    refused = _post(client, token, later)
    assert refused.status_code == 409, refused.text
    assert (_windows_of(scratch, hostile), _windows_of(scratch, later)) == (0, 0)


def test_a_body_the_lean_path_cannot_decode_gets_the_routes_4xx(
    served: tuple[TestClient, str],
) -> None:
    """Raw bytes that are not UTF-8 in a string (msgspec raised UnicodeDecodeError: a 500
    and a reset connection) and a body declared in another charset are the route's to refuse."""
    client, token = served
    body = b'{"batch_id":"%s","windows":[{"device":"sd\xc3\x28"}]}' % str(uuid.uuid4()).encode()
    before = _lean()
    refused = client.post("/api/v1/telemetry/batches", content=body, headers=_json(token))
    assert refused.status_code == 422, refused.text
    assert _lean_moved(before) == {"model_judges": 1}
    latin = client.post(
        "/api/v1/telemetry/batches",
        content=_batch(telemetry_window("loop0", index=0)).model_dump_json(),
        headers={**bearer(token), "content-type": "application/json; charset=latin-1"},
    )
    assert latin.status_code == 415, latin.text
    assert "UTF-8" in latin.json()["detail"]
