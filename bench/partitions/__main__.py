"""How big a telemetry partition should be, measured: hour, day or week.

For each size, a copy of telemetry_windows (same columns, primary key and BRIN index) is
partitioned over the raw retention (14 days) plus three days ahead, as the service keeps it,
and filled by the database with a 10 s window per device for those 14 days. Then, on that
table, timed with EXPLAIN ANALYZE (planning and execution apart, medians over --repeats):

- the device API's default read, a device's newest 1,000 windows with no time bound (every
  partition is a branch of the plan: the cost that grows with the number of partitions);
- a device page's read, the last hour of one device;
- the upkeep's rollup of one hour over every device;
- an hour of new windows for every device inserted (routing rows to their partitions);
- retention a day later: dropping what is past the horizon, and how much older data a size
  keeps because a partition goes only when all of it is past (up to one partition's span).

    python -m bench.partitions                 # 40 devices x 14 days (4.8M windows a size)

Records bench/results/partitions.json and a row in partitions.md with the command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.partitions import repository
from bench.record import provenance, record
from bench.unwind import on_termination

SIZES = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(days=7)}
RAW_DAYS, AHEAD_DAYS = 14, 3  # the service's defaults (RetentionPolicy)


def _floor(at: datetime, step: timedelta) -> datetime:
    epoch = datetime(1970, 1, 5, tzinfo=UTC)  # a Monday: weeks start on Mondays
    return epoch + (at - epoch) // step * step


def span(step: timedelta, low: datetime, high: datetime) -> list[tuple[datetime, datetime]]:
    bounds, at = [], _floor(low, step)
    while at < high:
        bounds.append((at, at + step))
        at += step
    return bounds


def measure(engine: Any, size: str, devices: list[uuid.UUID], repeats: int) -> dict[str, Any]:
    step, name = SIZES[size], f"pbench_{size}"
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    low = now - timedelta(days=RAW_DAYS)
    bounds = span(step, low, now + timedelta(days=AHEAD_DAYS))
    with engine.begin() as connection:
        repository.create(connection, name, bounds)
    began = time.perf_counter()
    with engine.begin() as connection:
        rows = repository.fill(connection, name, devices, low, now)
    fill_s = time.perf_counter() - began
    with engine.begin() as connection:
        repository.analyze(connection, name)

    timings: dict[str, list[tuple[float, float]]] = {"newest": [], "last_hour": [], "rollup": []}
    with engine.connect() as connection:
        for index in range(repeats):
            device = devices[index % len(devices)]
            timings["newest"].append(
                repository.explain(connection, repository.newest_windows(name), {"device": device})
            )
            timings["last_hour"].append(
                repository.explain(
                    connection,
                    repository.last_hour(name),
                    {"device": device, "since": now - timedelta(hours=1)},
                )
            )
            if index < max(3, repeats // 10):
                hour = now - timedelta(hours=2 + index)
                timings["rollup"].append(
                    repository.explain(
                        connection,
                        repository.hour_rollup(name),
                        {"low": hour, "high": hour + timedelta(hours=1)},
                    )
                )
    began = time.perf_counter()
    with engine.begin() as connection:
        inserted = repository.fill(connection, name, devices, now, now + timedelta(hours=1))
    insert_rate = inserted / (time.perf_counter() - began)
    horizon = now + timedelta(days=1) - timedelta(days=RAW_DAYS)
    began = time.perf_counter()
    with engine.begin() as connection:
        dropped = repository.drop_before(connection, name, horizon)
    drop_ms = (time.perf_counter() - began) * 1000
    with engine.begin() as connection:
        repository.drop(connection, name)

    def median(which: str, part: int) -> float:
        return round(statistics.median(t[part] for t in timings[which]), 3)

    return {
        "partitions": len(bounds),
        "windows": rows,
        "fill_seconds": round(fill_s, 1),
        **{
            f"{which}_{kind}_ms": median(which, part)
            for which in timings
            for part, kind in ((0, "planning"), (1, "execution"))
        },
        "insert_rows_per_second": round(insert_rate),
        "retention_drop_ms": round(drop_ms, 1),
        "partitions_dropped_a_day_later": dropped,
        # a partition goes only once all of it is past the horizon: up to its span kept longer
        "retained_beyond_horizon_share": round(step / timedelta(days=RAW_DAYS), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--devices", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--size", action="append", choices=list(SIZES), help="default: all")
    parser.add_argument("--database-url", default=None, help="default: embedded PostgreSQL")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    from service import db

    embedded = None
    on_termination()  # a stopped run still removes what it started
    scratch = Path(tempfile.mkdtemp(prefix="blkpilot-partitions-"))
    url = args.database_url
    if url is None:
        from service.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(scratch)
        url = embedded.start()
    devices = [uuid.uuid4() for _ in range(args.devices)]
    found: dict[str, dict[str, Any]] = {}
    try:
        db.upgrade(url, "head")
        engine = db.create_db_engine(url, pool_size=1)
        try:
            for size in args.size or list(SIZES):
                print(f"{size} partitions ...", flush=True)
                found[size] = measure(engine, size, devices, args.repeats)
                print(json.dumps(found[size]), flush=True)
        finally:
            engine.dispose()
    finally:
        if embedded is not None:
            embedded.stop()
        shutil.rmtree(scratch, ignore_errors=True)  # the database it measured

    result: dict[str, Any] = {
        "benchmark": "partitions",
        "devices": args.devices,
        "days": RAW_DAYS,
        "sizes": found,
        **provenance("partitions"),
    }
    sizes = list(found)

    def each(key: str) -> str:
        return " / ".join(str(found[s][key]) for s in sizes)

    result |= {
        "sizes_shown": " / ".join(sizes),
        "md_partitions": each("partitions"),
        "md_newest": " / ".join(
            f"{found[s]['newest_planning_ms']}+{found[s]['newest_execution_ms']}" for s in sizes
        ),
        "md_last_hour": " / ".join(
            f"{found[s]['last_hour_planning_ms']}+{found[s]['last_hour_execution_ms']}"
            for s in sizes
        ),
        "md_rollup": each("rollup_execution_ms"),
        "md_insert": each("insert_rows_per_second"),
        "md_drop": each("retention_drop_ms"),
        "md_kept": each("retained_beyond_horizon_share"),
    }
    print(json.dumps(result, indent=2))
    if not args.no_record:
        record(
            "partitions",
            result,
            {
                "sizes": "sizes_shown",
                "partitions": "md_partitions",
                "newest 1,000 ms (plan+run)": "md_newest",
                "last hour ms (plan+run)": "md_last_hour",
                "hour rollup ms": "md_rollup",
                "insert rows/s": "md_insert",
                "drop ms": "md_drop",
                "kept past horizon": "md_kept",
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
