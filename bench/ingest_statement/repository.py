"""The ingest-statement benchmark's SQL (bench.ingest_statement): the service's storing
statement, its arrays read alone, the JSON statement it replaced (2628eb2, 2026-11-29) and
COPY of the same rows — each asserting the rows it took — and what the benchmark needs
around them (a node, the backend's pid)."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import psycopg
from sqlalchemy import types as sa_types
from sqlalchemy.dialects import postgresql

from agent.contract.wire import TelemetryWindow
from service.tables import TelemetryWindowRow
from service.telemetry import columns, repository

# the statement's FROM clause read alone (no claim, no insert): every array taken apart
ARRAYS_ALONE = (
    f"SELECT count(*) FROM unnest({repository._UNNESTED}) AS u({repository._UNNESTED_AS})"  # noqa: S608
)
COPY = f"COPY {repository.RAW} ({', '.join(repository.WINDOW_COLUMNS)}) FROM STDIN"
# a batch's id, as decoded (BATCHES), its devices' ids, as encoded (encode_batch), and as
# the JSON statement read it (json_parameters)
Work = list[tuple[uuid.UUID, Any, dict[str, uuid.UUID], Any, dict[str, str]]]
WAYS = ("statement", "arrays_alone", "json", "copy")

# --- the statement the arrays replaced: the windows read from their JSON by
# json_to_recordset, their device ids and percentiles from a second JSON beside them


def _json_columns() -> tuple[str, str]:
    """Its column definitions for a window's JSON, and the value of each of WINDOW_COLUMNS,
    from the table (service.tables) as the service made them until 2628eb2, 2026-11-29."""
    fields = set(TelemetryWindow.model_fields)
    renamed = {"window_start": "start", "window_end": "end"}
    given = {"batch_id": "%(batch_id)s", **{name: f"w.{name}" for name in columns.GIVEN}}
    dialect: Any = postgresql.dialect()  # type: ignore[no-untyped-call]
    definitions, values = [], []
    for column in TelemetryWindowRow.__table__.columns:
        if column.name in given:
            values.append(given[column.name])
            continue
        field = renamed.get(column.name, column.name)
        assert field in fields, column.name
        json_column = isinstance(column.type, sa_types.JSON)
        kind = "json" if json_column else column.type.compile(dialect=dialect)
        definitions.append(f'"{field}" {kind}')
        value = f'w."{field}"'
        if json_column:
            cast = "::jsonb" if isinstance(column.type, postgresql.JSONB) else ""
            value = f"CASE WHEN {value}::text = '[]' THEN NULL ELSE {value}{cast} END"
        values.append(value)
    return ", ".join(definitions), ", ".join(values)


_DEFINITIONS, _VALUES = _json_columns()
_EXTRA = "device_id uuid, p50_us float8, p99_us float8, p999_us float8"
# the claim as the JSON statement made it (before overlapping windows were looked for)
JSON_CLAIM = (
    "INSERT INTO telemetry_batches (batch_id, node_id, windows, digest)"
    " VALUES (%(batch_id)s, %(node_id)s, %(count)s, %(digest)s)"
    " ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id"
)
JSON_STATEMENT = f"""
WITH claim AS ({JSON_CLAIM}),
stored AS (
    INSERT INTO {repository.RAW} ({repository._COLUMNS})
    SELECT {_VALUES}
    FROM ROWS FROM (
        json_to_recordset(%(windows)s::json) AS ({_DEFINITIONS}),
        json_to_recordset(%(extra)s::json) AS ({_EXTRA})
    ) AS w
    WHERE EXISTS (SELECT FROM claim)
    RETURNING 1
)
SELECT (SELECT count(*) FROM claim), (SELECT count(*) FROM stored)
"""  # noqa: S608


def json_parameters(
    batch: Any, ids: dict[str, uuid.UUID], percentiles: list[Any]
) -> dict[str, str]:
    """The JSON statement's two documents for a batch: its windows and, beside each, its
    device's id and percentiles."""
    extra = [
        {
            "device_id": ids[w.device],
            **dict(zip(columns.PERCENTILES, p or (None,) * 3, strict=True)),
        }
        for w, p in zip(batch.windows, percentiles, strict=True)
    ]
    return {
        "windows": msgspec.json.encode(batch.windows).decode(),
        "extra": msgspec.json.encode(extra).decode(),
    }


def add_node(connection: psycopg.Connection[Any]) -> uuid.UUID:
    """A node for the batches' claims (telemetry_batches.node_id references it)."""
    node = uuid.uuid4()
    connection.execute(
        "INSERT INTO nodes (id, hostname, labels, token_sha256, token_expires_at,"
        " agent_version, kernel_version, enrolled_at)"
        " VALUES (%s, 'bench', '{}', %s, now() + interval '1 day', '', '', now())",
        (node, uuid.uuid4().hex),
    )
    return node


def backend_pid(connection: psycopg.Connection[Any]) -> int:
    row = connection.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def store(
    connection: psycopg.Connection[Any], way: str, node: uuid.UUID, work: Work, copies: list[bytes]
) -> None:
    """Every batch of `work` stored (or read) one way of WAYS, each asserting the rows it
    took; `copies`: each batch's COPY text, for COPY."""
    for i, (batch_id, batch, _, encoded, json_documents) in enumerate(work):
        parameters = repository._parameters(batch_id, node, encoded)
        if way == "statement":
            row = connection.execute(repository._STORE, parameters).fetchone()
            assert row == (1, len(batch.windows), None), row  # claimed, stored, no overlap
        elif way == "arrays_alone":
            row = connection.execute(ARRAYS_ALONE, parameters).fetchone()
            assert row == (len(batch.windows),), row
        elif way == "json":
            claim = {k: parameters[k] for k in ("batch_id", "node_id", "count", "digest")}
            row = connection.execute(JSON_STATEMENT, {**claim, **json_documents}).fetchone()
            assert row == (1, len(batch.windows)), row
        elif way == "copy":
            with connection.transaction(), connection.cursor() as cursor:
                with cursor.copy(COPY) as stream:
                    stream.write(copies[i])
                assert cursor.rowcount == len(batch.windows), cursor.rowcount
        else:
            raise ValueError(f"no such way: {way!r}")


def create_database(conninfo: str, name: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
