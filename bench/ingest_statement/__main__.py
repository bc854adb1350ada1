"""Where PostgreSQL's time goes when it stores a telemetry batch: its backend's CPU a window
(exact, from /proc/PID/task/*/schedstat) for the same 500-window batches stored

- by the service's storing statement (service.telemetry.repository: the claim, and the windows
  taken from one binary array per column by unnest), each batch committed on its own, as a
  push is;
- reading its arrays alone (unnest, every column typed, no insert);
- by the statement it replaced (2628eb2, 2026-11-29): the windows read from their JSON with
  json_to_recordset, their device ids and percentiles from a second JSON beside them;
- by COPY of the same rows (bench.copytext, formatted before the clock starts), each batch in
  a transaction of its own: what the rows cost the database with nothing to take apart.

Against an embedded PostgreSQL of its own (pgserver), removed at the end. bench.ingest's
"share of COPY" compares the HTTP path with one COPY of every row in one transaction; this
splits the database's part of the gap.

    python -m bench.ingest_statement                 # 80 batches of 500 windows, two rounds
    python -m bench.ingest_statement --batches 20 --no-record
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url

from bench.copytext import copy_text, window_rows
from bench.cpu import run_ns
from bench.ingest import build_batches
from bench.ingest_statement import repository
from bench.ingest_statement.repository import Work
from bench.record import provenance, record
from bench.unwind import on_termination
from service import db
from service.embedded import EmbeddedPostgres
from service.telemetry import distributions
from service.telemetry.retention import RetentionPolicy, maintain
from service.telemetry.service import BATCHES, encode_batch

DEVICES = [f"nvme{i}n1" for i in range(16)]


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _batches(count: int, windows: int, tag: str) -> Work:
    """Decoded and encoded as the service does, for devices of this way's own (no row is
    stored twice across ways and rounds)."""
    made = []
    for body in build_batches(DEVICES, count, windows):
        batch = BATCHES.decode(body)
        ids = {d: uuid.uuid5(uuid.NAMESPACE_OID, f"{tag}/{d}") for d in DEVICES}
        found = distributions.window_percentiles(batch.windows)
        documents = repository.json_parameters(batch, ids, found)
        made.append((uuid.uuid4(), batch, ids, encode_batch(batch, ids).stored, documents))
    return made


def measure(conninfo: str, batches: int, windows: int, rounds: int) -> dict[str, Any]:
    ways: dict[str, list[float]] = {way: [] for way in repository.WAYS}
    for round_ in range(rounds):
        for way, costs in ways.items():
            work = _batches(batches, windows, f"{way}{round_}")
            # formatted before the clock starts
            copies = [copy_text(window_rows(b, ids))[0] for _, b, ids, *_ in work if way == "copy"]
            with psycopg.connect(conninfo, autocommit=True) as connection:
                node = repository.add_node(connection)
                backend = repository.backend_pid(connection)
                before = run_ns(backend)
                repository.store(connection, way, node, work, copies)
                costs.append((run_ns(backend) - before) / 1e3 / (len(work) * windows))
    return {f"{way}_us_per_window": [round(c, 2) for c in costs] for way, costs in ways.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=80)
    parser.add_argument("--windows", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    on_termination()  # a stopped run still removes what it started
    data = Path(tempfile.mkdtemp(prefix="blkpilot-ingest-statement-"))
    try:
        with EmbeddedPostgres(data) as server:
            repository.create_database(_conninfo(server), "bench")
            url = make_url(server).set(database="bench").render_as_string(hide_password=False)
            db.upgrade(url)
            engine = db.create_db_engine(url, pool_size=1)
            try:
                maintain(engine, RetentionPolicy())  # the days' partitions, as serve keeps them
            finally:
                engine.dispose()
            result = measure(_conninfo(url), args.batches, args.windows, args.rounds)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    best = {way: min(costs) for way, costs in result.items()}
    result.update(
        {
            "statement_over_copy": round(
                best["statement_us_per_window"] / best["copy_us_per_window"], 2
            ),
            "json_statement_over_statement": round(
                best["json_us_per_window"] / best["statement_us_per_window"], 2
            ),
            "batches": args.batches,
            "windows_per_batch": args.windows,
            "rounds": args.rounds,
            **provenance("ingest_statement"),
        }
    )
    result = {"benchmark": "ingest_statement", **result}
    print(json.dumps(result, indent=2))
    if not args.no_record:
        record(
            "ingest_statement",
            result,
            {
                "statement µs a window": "statement_us_per_window",
                "its arrays read alone": "arrays_alone_us_per_window",
                "the JSON statement before it": "json_us_per_window",
                "COPY": "copy_us_per_window",
                "statement / COPY": "statement_over_copy",
                "JSON statement / statement": "json_statement_over_statement",
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
