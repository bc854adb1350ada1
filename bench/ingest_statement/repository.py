"""The ingest-statement benchmark's SQL (bench.ingest_statement): the service's storing
statement, its JSON read alone, the same with jsonb, and COPY of the same rows — each
asserting the rows it took — and what the benchmark needs around them (a node, the backend's
pid)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from service.telemetry import repository

# the statement's FROM clause and its column list, read alone (no claim, no insert); the
# column definitions are the table's own (service.tables), not input
_WINDOWS = f"json_to_recordset(%(windows)s::json) AS ({repository._DEFINITIONS})"
_EXTRAS = f"json_to_recordset(%(extra)s::json) AS ({repository._EXTRA})"
PARSE_ALONE = f"SELECT count(*) FROM ROWS FROM ({_WINDOWS}, {_EXTRAS}) AS w"  # noqa: S608
# the statement as it would be with jsonb: its input builds the whole document first
JSONB = repository._STORE.replace(
    "json_to_recordset(%(windows)s::json)", "jsonb_to_recordset(%(windows)s::jsonb)"
)
assert JSONB != repository._STORE
COPY = f"COPY {repository.RAW} ({', '.join(repository.WINDOW_COLUMNS)}) FROM STDIN"
# a batch's id, as decoded (BATCHES), its devices' ids, and as encoded (encode_batch)
Work = list[tuple[uuid.UUID, Any, dict[str, uuid.UUID], Any]]
WAYS = ("statement", "parse_alone", "jsonb", "copy")


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
    for i, (batch_id, batch, _, encoded) in enumerate(work):
        parameters = repository._parameters(batch_id, node, encoded)
        if way == "statement":
            row = connection.execute(repository._STORE, parameters).fetchone()
            assert row == (1, len(batch.windows)), row
        elif way == "jsonb":
            row = connection.execute(JSONB, parameters).fetchone()
            assert row == (1, len(batch.windows)), row
        elif way == "parse_alone":
            row = connection.execute(PARSE_ALONE, parameters).fetchone()
            assert row == (len(batch.windows),), row
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
