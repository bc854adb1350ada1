"""COPY's text of raw telemetry windows, for bench.ingest's measure of the database's own
pace: the rows the service stores (window_rows), COPYed into the partitioned table with
nothing else in the way.

The service formatted its pushes this way until it stored them with one statement
(repository.store_batch, 2026-11-27); the formatter stays with the benchmark that still
COPYs, so the baseline is still the fastest way in that PostgreSQL offers."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any

import msgspec
from sqlalchemy import types as sa_types

from service.tables import TelemetryWindowRow
from service.telemetry import distributions
from service.telemetry.repository import WINDOW_COLUMNS

_VALUES = itemgetter(*WINDOW_COLUMNS)


def copy_text(rows: Iterable[dict[str, Any]]) -> tuple[bytes, int]:
    """The rows as COPY's text format, every column in WINDOW_COLUMNS' order, and how many.

    Formatted in bulk, where psycopg's write_row formats value by value through its adapters
    (7 µs a window): one expression per row
    made from the columns' types (_line_format) — a float as repr (it reads back as the same
    double), an integer as str, text escaped as COPY reads it (backslash, tab, newline,
    carriage return), JSON as msgspec's, None as \\N — and the values a batch repeats (its
    id, each device's id, the windows' bounds, shared by its devices) formatted once."""
    memo = _Memo()
    line = _LINE
    lines = [line(_VALUES(row), memo) for row in rows]
    lines.append("")
    return "\n".join(lines).encode(), len(lines) - 1


_COPY_ESCAPES = re.compile(r"[\\\t\n\r]")
_ESCAPED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _copy_str(value: str) -> str:
    if _COPY_ESCAPES.search(value) is None:
        return value
    return _COPY_ESCAPES.sub(lambda m: _ESCAPED[m.group()], value)


def _copy_json(value: Any) -> str:
    return _copy_str(msgspec.json.encode(value).decode())


class _Memo(dict[Any, str]):
    """UUIDs and timestamps as COPY text, each formatted once (str of a UUID and isoformat
    cost 0.5-0.8 µs a value)."""

    def __missing__(self, value: Any) -> str:
        if isinstance(value, datetime):
            if value.tzinfo is None:
                raise ValueError("a naive timestamp: the raw table stores instants")
            text = value.isoformat()
        elif isinstance(value, uuid.UUID):
            text = str(value)
        else:
            raise TypeError(f"no COPY text kept for {type(value).__name__}")
        self[value] = text
        return text


def _line_format(columns: Sequence[Any]) -> Callable[[tuple[Any, ...], _Memo], str]:
    """A function of (values, memo) to one COPY line: an f-string per column type, compiled
    once (a call per value cost more than the formatting)."""
    parts = []
    for index, column in enumerate(columns):
        kind, value = column.type, f"v[{index}]"
        if isinstance(kind, sa_types.Uuid | sa_types.DateTime):
            text = f"m[{value}]"
        elif isinstance(kind, sa_types.BigInteger):
            text = f"str({value})"
        elif isinstance(kind, sa_types.Float):
            text = f"repr({value})"
        elif isinstance(kind, sa_types.JSON):  # json and jsonb
            text = f"json({value})"
        elif isinstance(kind, sa_types.String):
            text = f"escape({value})"
        else:
            raise TypeError(f"{column.name}: no COPY text for {kind!r}")
        if column.nullable:
            text = f"(NULL if {value} is None else {text})"
        parts.append("{" + text + "}")
    source = 'lambda v, m: f"' + "\\t".join(parts) + '"'
    names = {"NULL": "\\N", "json": _copy_json, "escape": _copy_str}
    made: Callable[[tuple[Any, ...], _Memo], str] = eval(source, names)  # noqa: S307
    return made


_LINE = _line_format(list(TelemetryWindowRow.__table__.columns))


def window_rows(
    batch: Any, device_ids: dict[str, uuid.UUID], checked: Any = None
) -> list[dict[str, Any]]:
    """The batch's windows as the raw table stores them, each with its device-time
    percentiles (the batch's histograms merged and read in arrays: distributions, from
    `checked`, what its check returned, where given) — in Python, field by field: what
    repository.store_batch's statement stores from the windows' JSON, written out (a test holds
    the two to the same rows: tests/service/test_ingest_statement.py)."""
    summaries = distributions.window_summaries(batch.windows, checked)
    return [
        window_row(w, device_ids[w.device], batch.batch_id, summary)
        for w, summary in zip(batch.windows, summaries, strict=True)
    ]


def window_row(
    w: Any, device_id: uuid.UUID, batch_id: uuid.UUID, percentiles: dict[str, float | None]
) -> dict[str, Any]:
    """A window as the raw table stores it; percentiles: window_percentiles_us's."""
    return {
        "device_id": device_id,
        "batch_id": batch_id,
        "window_start": w.start,
        "window_end": w.end,
        "read_ios": w.read_ios,
        "write_ios": w.write_ios,
        "read_bytes": w.read_bytes,
        "write_bytes": w.write_bytes,
        "iops": w.iops,
        "read_share": w.read_share,
        "mean_request_bytes": w.mean_request_bytes,
        "mean_latency_us": w.mean_latency_us,
        "queue_depth": w.queue_depth,
        "utilisation": w.utilisation,
        "power_watts": w.power_watts,
        "energy_joules": w.energy_joules,
        "power_scope": w.power_scope and w.power_scope.value,
        "cpu_utilisation": w.cpu_utilisation,
        "context_switches_per_s": w.context_switches_per_s,
        "power_source": w.power_source and w.power_source.value,
        # structs as they came: copy_text writes them as JSON, as they were sent
        "power_readings": w.power_readings or None,
        "latency_source": w.latency_source.value,
        "latency_note": w.latency_note,
        "operations": w.operations or None,
        **percentiles,
    }
