"""RocksDB db_bench readrandom. The database is prepared once per target (fillseq, so every
key exists) and reused while its settings match; reads use direct I/O so they reach the device."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent.bench.target import SCRATCH_PREFIX, BenchTarget
from agent.contract.workloads import DbBenchSpec
from agent.effects import Effects
from agent.errors import BenchmarkFailed

_RESULT = re.compile(
    r"^readrandom\s*:\s*([\d.]+) micros/op\s+(\d+) ops/sec\s+([\d.]+) seconds\s+(\d+) operations",
    re.M,
)
_PERCENTILES = re.compile(
    r"Percentiles: P50: ([\d.]+) P75: ([\d.]+) P99: ([\d.]+) P99\.9: ([\d.]+)"
)
_FOUND = re.compile(r"\((\d+) of (\d+) found\)")


def parse(text: str, value_size: int) -> dict[str, float]:
    result = _RESULT.search(text)
    if result is None:
        raise BenchmarkFailed(f"db_bench output has no readrandom result: {text[-300:]!r}")
    micros, ops_per_s, seconds, operations = (float(g) for g in result.groups())
    metrics = {
        "iops": ops_per_s,
        "lat_mean_us": micros,
        "bw_bytes_per_s": ops_per_s * value_size,
        "ios": operations,
        "io_bytes": operations * value_size,
        "seconds": seconds,
    }
    percentiles = _PERCENTILES.search(text)
    if percentiles:
        p50, _, p99, p999 = (float(g) for g in percentiles.groups())
        metrics.update(lat_p50_us=p50, lat_p99_us=p99, lat_p999_us=p999)
    found = _FOUND.search(text)
    if found and int(found.group(1)) != int(found.group(2)):
        raise BenchmarkFailed(f"db_bench found only {found.group(1)} of {found.group(2)} keys")
    return metrics


@dataclass(frozen=True)
class DbBenchDatabase:
    path: Path
    keys: int


def _common(spec: DbBenchSpec, db: DbBenchDatabase) -> list[str]:
    return [
        f"--db={db.path}",
        f"--num={db.keys}",
        f"--key_size={spec.key_size}",
        f"--value_size={spec.value_size}",
        "--compression_type=none",
    ]


def database(spec: DbBenchSpec, target: BenchTarget) -> DbBenchDatabase:
    """Where the spec's database goes on the target, and how many keys it holds."""
    keys = max(
        1_000, min(spec.max_keys, int(target.size_bytes * spec.fill_fraction) // spec.value_size)
    )
    return DbBenchDatabase(target.path / f"{SCRATCH_PREFIX}-rocksdb", keys)


def fill_arguments(spec: DbBenchSpec, db: DbBenchDatabase) -> list[str]:
    """db_bench's arguments that fill the database (every key, in order)."""
    return [
        "--benchmarks=fillseq",
        *_common(spec, db),
        "--use_direct_io_for_flush_and_compaction=true",
    ]


def read_arguments(spec: DbBenchSpec, db: DbBenchDatabase, duration_s: float) -> list[str]:
    """db_bench's arguments for `duration_s` of random reads of the filled database, with
    direct I/O (they reach the device) and the latency histogram `parse` reads."""
    return [
        "--benchmarks=readrandom",
        "--use_existing_db=1",
        *_common(spec, db),
        "--use_direct_reads=true",
        f"--duration={max(1, round(duration_s))}",
        "--histogram=1",
        f"--threads={spec.threads}",
    ]


def prepare(spec: DbBenchSpec, target: BenchTarget, effects: Effects) -> DbBenchDatabase:
    """Fill the database once; reuse it while the spec that made it is the same."""
    db = database(spec, target)
    marker = target.path / f"{SCRATCH_PREFIX}-rocksdb.json"
    made_by = {**spec.model_dump(exclude={"threads"}), "keys": db.keys}
    if marker.exists() and json.loads(marker.read_text()) == made_by and db.path.is_dir():
        return db
    shutil.rmtree(db.path, ignore_errors=True)
    fill = effects.run(_binary(), *fill_arguments(spec, db), timeout=3_600)
    if fill.returncode != 0:
        raise BenchmarkFailed(f"db_bench fillseq failed: {fill.stderr.strip()[-500:]}")
    marker.write_text(json.dumps(made_by))
    return db


def _binary() -> str:
    found = shutil.which("db_bench")
    if found is None:
        raise BenchmarkFailed("db_bench is not installed (Debian package rocksdb-tools)")
    return found


def run(
    spec: DbBenchSpec, target: BenchTarget, duration_s: float, effects: Effects | None = None
) -> dict[str, float]:
    effects = effects or Effects()
    db = prepare(spec, target, effects)
    result = effects.run(_binary(), *read_arguments(spec, db, duration_s), timeout=duration_s + 120)
    if result.returncode != 0:
        raise BenchmarkFailed(f"db_bench readrandom failed: {result.stderr.strip()[-500:]}")
    return parse(result.stdout, spec.value_size)
