"""A batch's windows as the storing statement reads them (repository.store_batch): one
PostgreSQL array per column of the raw table, in the binary format PostgreSQL's `array_recv`
reads, taken apart side by side by `unnest` — no JSON for the database to parse.

Why: the statement read the windows from their JSON with `json_to_recordset`, and three
quarters of its cost was that parse. `python -m bench.ingest_statement`, 2026-11-29
(bench/results/ingest_statement.md): 8.9-9.3 µs of PostgreSQL's CPU a window for the JSON
statement, 5.3 with these arrays, 4.9-5.1 with COPY of the same rows.
The arrays are built column by column in bulk (attrgetter, numpy), never value by
value through a driver's adapters (psycopg's list dumping cost serve more than the parse
saved, 2026-11-27).

The columns are the table's (service.tables.TelemetryWindowRow): a column named as a
contract field (agent.contract.wire.TelemetryWindow) holds that field, `window_start` and
`window_end` the window's bounds; `device_id` and the percentiles are given by the service
(GIVEN); `batch_id` is the statement's one scalar. A column whose type or source is not known
here fails at import, so the table and the statement cannot drift apart."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from itertools import chain
from operator import attrgetter
from typing import Any

import annotated_types
import msgspec
import numpy as np
from psycopg import postgres
from sqlalchemy import types as sa_types
from sqlalchemy.dialects import postgresql

from agent.contract.wire import TelemetryWindow
from service.tables import TelemetryWindowRow

# a column not read from the window's contract fields: the statement's scalar, the device's id
# (from the node's device map) and the device-time percentiles, in µs (None without eBPF)
SCALAR = "batch_id"
PERCENTILES = ("p50_us", "p99_us", "p999_us")
GIVEN = ("device_id", *PERCENTILES)
_RENAMED = {"window_start": "start", "window_end": "end"}


@dataclass(frozen=True)
class Column:
    """A raw-table column as the statement takes it: its name, its element type's name in
    PostgreSQL, whether it may be NULL, and the contract field it is read from (None: GIVEN)."""

    name: str
    kind: str
    nullable: bool
    field: str | None


def _kind(column_type: Any) -> str:
    # the most specific first: JSONB is a JSON, Text a String, Double a Float
    for sa_type, kind in (
        (postgresql.JSONB, "jsonb"),
        (sa_types.JSON, "json"),
        (sa_types.BigInteger, "int8"),
        (sa_types.Double, "float8"),
        (sa_types.String, "text"),
        (sa_types.Uuid, "uuid"),
    ):
        if isinstance(column_type, sa_type):
            return kind
    if isinstance(column_type, sa_types.DateTime) and column_type.timezone:
        return "timestamptz"
    raise TypeError(f"no binary array for a column of type {column_type!r}")


def _columns() -> tuple[Column, ...]:
    fields = set(TelemetryWindow.model_fields)
    made = []
    for column in TelemetryWindowRow.__table__.columns:
        if column.name == SCALAR:
            continue
        field = None if column.name in GIVEN else _RENAMED.get(column.name, column.name)
        if field is not None and field not in fields:
            raise TypeError(f"telemetry_windows.{column.name}: no contract field to store in it")
        kind = _kind(column.type)
        nullable = bool(column.nullable)
        if nullable and kind in ("int8", "timestamptz", "uuid"):
            raise TypeError(f"telemetry_windows.{column.name}: a NULL {kind} is not encoded here")
        made.append(Column(column.name, kind, nullable, field))
    return tuple(made)


# every array column, in the table's order
COLUMNS = _columns()
# each element type's and its array type's oid, as psycopg knows PostgreSQL's built-in types
OIDS = {
    kind: (info.oid, info.array_oid)
    for kind in {c.kind for c in COLUMNS}
    if (info := postgres.types.get(kind)) is not None
}
assert OIDS.keys() == {c.kind for c in COLUMNS}


def select_value(column: Column) -> str:
    """The column's value in the statement's SELECT, from `unnest`'s `u`: a nullable float is
    sent as NaN where it is None (NaN is never stored: JSON has none, and the JSON statement
    before this stored msgspec's `null` for it)."""
    if column.kind == "float8" and column.nullable:
        return f"nullif(u.{column.name}, 'NaN'::float8)"
    return f"u.{column.name}"


_HEADER = struct.Struct(">iiiii")  # dimensions, has NULLs, element oid, length, lower bound
_LENGTH = struct.Struct(">i")
_NULL = _LENGTH.pack(-1)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_NAN = float("nan")
_ENCODER = msgspec.json.Encoder()


def _header(kind: str, count: int, nulls: bool) -> bytes:
    return _HEADER.pack(1, int(nulls), OIDS[kind][0], count, 1)


def _variable(kind: str, values: Sequence[bytes | None]) -> bytes:
    """An array of byte strings, None as NULL; all alike (a column most batches repeat) is
    written once and repeated."""
    count = len(values)
    first = values[0] if count else None
    if values.count(first) == count:
        if first is None:
            return _header(kind, count, True) + _NULL * count
        return _header(kind, count, False) + (_LENGTH.pack(len(first)) + first) * count
    parts = [_NULL if v is None else _LENGTH.pack(len(v)) + v for v in values]
    return _header(kind, count, None in values) + b"".join(parts)


def _text(value: Any) -> bytes | None:
    if value is None:
        return None
    text: str = value.value if isinstance(value, Enum) else value
    return text.encode()


def _group(kind: str, nullable: bool) -> tuple[Column, ...]:
    return tuple(
        c for c in COLUMNS if c.field is not None and c.kind == kind and c.nullable == nullable
    )


def _getter(group: Sequence[Column]) -> Callable[[Any], tuple[Any, ...]]:
    """A window's values of the group's fields, as a tuple (attrgetter of one name gives the
    value, not a tuple of it)."""
    fields = [c.field for c in group]
    if len(fields) == 1:
        one = attrgetter(fields[0])  # type: ignore[arg-type]
        return lambda w: (one(w),)
    return attrgetter(*fields)  # type: ignore[arg-type]


# every column but the variable-width ones is 8 bytes an element (int8, float8, timestamptz):
# laid out together, in one numpy pass
_INTS = _group("int8", False)
_BOUNDS = _group("timestamptz", False)
_FLOATS = _group("float8", False)
_NULLABLE_FLOATS = _group("float8", True)
_TEXTS = _group("text", True) + _group("text", False)
_JSON = tuple(c for c in COLUMNS if c.kind in ("json", "jsonb"))
_PERCENTILE_COLUMNS = tuple(next(c for c in COLUMNS if c.name == n) for n in PERCENTILES)
_FIXED = (*_INTS, *_BOUNDS, *_FLOATS, *_NULLABLE_FLOATS, *_PERCENTILE_COLUMNS)
assert {c.name for c in COLUMNS} == {"device_id", *(c.name for c in (*_FIXED, *_TEXTS, *_JSON))}, (
    "a column of the raw table no group encodes"
)
assert all(c.kind == "float8" and c.nullable for c in _PERCENTILE_COLUMNS)
assert next(c for c in COLUMNS if c.name == "device_id").kind == "uuid"
_GET_NUMBERS, _GET_BOUNDS = _getter(_INTS + _FLOATS), _getter(_BOUNDS)
_GET_NULLABLE = _getter(_NULLABLE_FLOATS)
# each group's rows in _FIXED's layout
_AT_INTS = slice(0, len(_INTS))
_AT_BOUNDS = slice(_AT_INTS.stop, _AT_INTS.stop + len(_BOUNDS))
_AT_FLOATS = slice(_AT_BOUNDS.stop, _AT_BOUNDS.stop + len(_FLOATS))
_AT_NULLABLE = slice(_AT_FLOATS.stop, _AT_FLOATS.stop + len(_NULLABLE_FLOATS))
_AT_PERCENTILES = slice(_AT_NULLABLE.stop, len(_FIXED))
_NAN_BITS = np.float64(float("nan")).view(np.uint64)
# the integers the contract takes are read as doubles: each field's bounds must keep it one
# exactly (a double holds every integer up to 2**53)
_EXACT = 2**53


def _exact_as_double(field: str) -> bool:
    bounds = TelemetryWindow.model_fields[field].metadata
    low = next((b.ge for b in bounds if isinstance(b, annotated_types.Ge)), None)
    high = next((b.le for b in bounds if isinstance(b, annotated_types.Le)), None)
    return low is not None and high is not None and low >= -_EXACT and high <= _EXACT


for _column in _INTS:
    if not _exact_as_double(_column.field):  # type: ignore[arg-type]
        raise TypeError(f"telemetry_windows.{_column.name}: its field may pass 2**53")
_GET_TEXTS = _getter(_TEXTS)
_DEVICE = attrgetter("device")
_UUID_LENGTH = _LENGTH.pack(16)
# what a window holds, for the batch's digest: every column read from a contract field, in
# COLUMNS' order, after the device names; not the device ids (the node's, not the batch's)
# nor the percentiles (worked out from the operations)
_CONTENT = tuple(c.name for c in COLUMNS if c.field is not None)
_UNSTORED = set(TelemetryWindow.model_fields) - {"device"} - {c.field for c in COLUMNS}
assert not _UNSTORED, f"contract fields no column holds, so no digest covers: {_UNSTORED}"


@dataclass(frozen=True)
class Encoded:
    """A batch's windows as the statement reads them: `arrays`, each of COLUMNS by name, and
    `digest`, the SHA-256 (hex) of their content (_CONTENT and the device names): the same
    windows give the same digest, however they were written in JSON."""

    arrays: dict[str, bytes]
    digest: str


def encode(
    windows: Sequence[Any],
    device_ids: dict[str, Any],
    percentiles: Sequence[tuple[float, float, float] | None],
) -> Encoded:
    """Each column of COLUMNS as a binary array of the windows' values, in their order, and
    their digest: `windows` decoded (service.fastwire), `device_ids` each device name's id,
    `percentiles` each window's (p50, p99, p999) in µs or None."""
    count = len(windows)
    arrays: dict[str, bytes] = {}

    names = list(map(_DEVICE, windows))
    distinct = set(names)
    element = {name: _UUID_LENGTH + device_ids[name].bytes for name in distinct}
    arrays["device_id"] = _header("uuid", count, False) + b"".join(map(element.__getitem__, names))
    spelled = {name: name.encode() for name in distinct}
    digest = hashlib.sha256(_variable("text", list(map(spelled.__getitem__, names))))

    # (columns, windows) of 8-byte values, each row a column of _FIXED: integers, instants as
    # µs since 2000-01-01 UTC, floats with NaN for None (the statement's nullif)
    laid = np.empty((len(_FIXED), count), dtype=[("length", ">i4"), ("value", ">u8")])
    laid["length"] = 8
    value = laid["value"]
    # the integers and the floats that are never None read together, as doubles (every
    # integer the contract takes is one exactly: _exact_as_double)
    width = len(_INTS) + len(_FLOATS)
    numbers = (
        np.fromiter(
            chain.from_iterable(map(_GET_NUMBERS, windows)), dtype=np.float64, count=count * width
        )
        .reshape(count, width)
        .T
    )
    value[_AT_INTS] = numbers[: len(_INTS)].astype(np.int64).view(np.uint64)
    value[_AT_FLOATS] = numbers[len(_INTS) :].view(np.uint64)
    bounds = list(chain.from_iterable(map(_GET_BOUNDS, windows)))
    # windows share their bounds across a node's devices: each instant converted once
    since = {b: (b - _PG_EPOCH) // _MICROSECOND for b in set(bounds)}
    instants = np.fromiter(map(since.__getitem__, bounds), dtype=np.int64, count=len(bounds))
    value[_AT_BOUNDS] = instants.reshape(count, len(_BOUNDS)).T.view(np.uint64)
    nullable = list(chain.from_iterable(map(_GET_NULLABLE, windows)))
    if None in nullable:
        nullable = [_NAN if v is None else v for v in nullable]
    floats = np.array(nullable, dtype=np.float64).reshape(count, len(_NULLABLE_FLOATS)).T
    value[_AT_NULLABLE] = floats.view(np.uint64)
    if percentiles.count(None) == count:
        value[_AT_PERCENTILES] = _NAN_BITS
    else:
        none = (_NAN, _NAN, _NAN)
        each = chain.from_iterable(none if p is None else p for p in percentiles)
        laid_out = np.fromiter(each, dtype=np.float64, count=count * 3).reshape(count, 3)
        value[_AT_PERCENTILES] = laid_out.T.view(np.uint64)
    for column, laid_row in zip(_FIXED, laid, strict=True):
        arrays[column.name] = _header(column.kind, count, False) + laid_row.tobytes()

    for column, texts in zip(_TEXTS, zip(*map(_GET_TEXTS, windows), strict=True), strict=True):
        if texts.count(texts[0]) == count:  # one value: encoded once, repeated
            arrays[column.name] = _variable("text", [_text(texts[0])] * count)
            continue
        once = {v: _text(v) for v in set(texts)}  # a few values, repeated: each encoded once
        arrays[column.name] = _variable("text", list(map(once.__getitem__, texts)))
    for column in _JSON:
        lists = list(map(attrgetter(column.field), windows))  # type: ignore[arg-type]
        values: list[bytes | None] = [None] * count  # an empty list is stored as NULL
        if any(lists):
            # jsonb's binary form is a version byte, then the text; json's is the text
            prefix = b"\x01" if column.kind == "jsonb" else b""
            values = [prefix + _ENCODER.encode(v) if v else None for v in lists]
        arrays[column.name] = _variable(column.kind, values)

    for name in _CONTENT:
        digest.update(arrays[name])
    return Encoded(arrays, digest.hexdigest())
