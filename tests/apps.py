"""Real applications on lab devices, for the live canary's tests and benchmarks: PostgreSQL
(the embedded server's own binaries) with pgbench on a filesystem on a loop device, and
prometheus-postgres-exporter (Debian) in front of it, exporting the WAL's sync count and time
— the part of a commit the device decides — for the canary's application SLI; and RocksDB's
db_bench (Debian's rocksdb-tools) reading a database on such a filesystem with direct reads."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

EXPORTER = "/usr/bin/prometheus-postgres-exporter"
# what the exporter runs beside its defaults (turned off: each scrape then costs one query)
WAL_QUERIES = """\
pg_stat_wal:
  query: "SELECT wal_sync, wal_sync_time FROM pg_stat_wal"
  metrics:
    - wal_sync:
        usage: "COUNTER"
        description: "WAL syncs (fsync or fdatasync of WAL files)"
    - wal_sync_time:
        usage: "COUNTER"
        description: "Milliseconds spent syncing WAL (track_wal_io_timing)"
"""


def _pg_bin(name: str) -> str:
    import pgserver

    return str(Path(pgserver.__file__).parent / "pginstall" / "bin" / name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Postgres:
    uri: str  # libpq URI, over the Unix socket in the data directory
    socket_dir: str

    def sql(self, statement: str) -> str:
        done = subprocess.run(
            [_pg_bin("psql"), "-X", "-q", "-At", "-d", self.uri, "-c", statement],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout.strip()


@contextmanager
def postgres_on(mountpoint: Path) -> Iterator[Postgres]:
    """A PostgreSQL server whose data directory is on the filesystem at mountpoint, with WAL
    I/O timing on; stopped at exit."""
    from service.embedded import EmbeddedPostgres

    embedded = EmbeddedPostgres(mountpoint / "pg")
    uri = embedded.start()
    try:
        host = httpx.URL(uri).params.get("host") or str(embedded.pgdata)
        database = Postgres(uri.replace("postgresql+psycopg://", "postgresql://"), host)
        database.sql("ALTER SYSTEM SET track_wal_io_timing = on")
        database.sql("SELECT pg_reload_conf()")
        yield database
    finally:
        embedded.stop()


@contextmanager
def pgbench(
    database: Postgres, *, clients: int = 4, scale: int = 10, initialise: bool = True
) -> Iterator[Path]:
    """pgbench's TPC-B-like load (initialised at `scale` unless told the tables are there),
    running until the context ends; yields the log of its per-second progress."""
    if initialise:
        subprocess.run(
            [_pg_bin("pgbench"), "-i", "-q", "-s", str(scale), database.uri],
            capture_output=True,
            timeout=600,
            check=True,
        )
    log = Path(database.socket_dir) / "pgbench.progress"
    with log.open("w") as out:
        process = subprocess.Popen(
            [_pg_bin("pgbench"), "-n", "-c", str(clients), "-j", "2", "-T", "86400", "-P", "1",
             database.uri],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield log
    finally:
        process.terminate()
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        if process.poll() is None:
            process.kill()
            process.wait()


@contextmanager
def postgres_exporter(database: Postgres, workdir: Path) -> Iterator[str]:
    """prometheus-postgres-exporter on loopback, exporting pg_stat_wal; yields its URL."""
    queries = workdir / "wal-queries.yaml"
    queries.write_text(WAL_QUERIES)
    port = _free_port()
    env = {
        **os.environ,
        "DATA_SOURCE_NAME": f"host={database.socket_dir} user=postgres dbname=postgres"
        " sslmode=disable",
    }
    with (workdir / "exporter.log").open("w") as out:
        process = subprocess.Popen(
            [EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--disable-default-metrics",
             "--disable-settings-metrics", f"--extend.query-path={queries}"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the exporter exited: {(workdir / 'exporter.log').read_text()}")
            with suppress(httpx.TransportError):
                if "pg_stat_wal_wal_sync" in httpx.get(url, timeout=2).text:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no pg_stat_wal at {url} within 30 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@dataclass
class RocksDb:
    """A RocksDB database filled by db_bench, and the readrandom run that reads it: direct
    reads (no page cache) through an 8 MiB block cache, two threads — every get a device read
    of a few KiB, CPU-bound on two cores."""

    path: Path

    def reads(self, *extra: str) -> list[str]:
        return [
            "db_bench", "--benchmarks=readrandom", "--use_existing_db=1",
            "--use_direct_reads=1", "--threads=2", "--cache_size=8388608",
            *self._common(), *extra,
        ]  # fmt: skip

    def _common(self) -> list[str]:
        return [f"--db={self.path}", "--num=400000", "--value_size=1000", "--compression_type=none"]

    def fill(self) -> None:
        """Filled and compacted: left uncompacted, each open of the database compacts in the
        background, and the reads that follow get faster run by run (a trend an A B A B
        comparison reads as an effect: -26 % for an unchanged configuration)."""
        subprocess.run(
            ["db_bench", "--benchmarks=fillrandom,compact", *self._common()],
            capture_output=True, check=True, timeout=900,
        )  # fmt: skip

    def p50_us(self, seconds: float) -> float:
        """db_bench alone for that long: its readrandom p50 in µs."""
        out = subprocess.run(
            [*self.reads(f"--duration={seconds:.0f}", "--histogram=1")],
            capture_output=True, text=True, timeout=seconds + 120, check=True,
        ).stdout  # fmt: skip
        found = re.search(r"P50: ([\d.]+)", out)
        assert found, out
        return float(found.group(1))

    @contextmanager
    def traffic(self) -> Iterator[None]:
        """readrandom until the context ends."""
        process = subprocess.Popen(
            self.reads("--duration=86400"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            time.sleep(1)
            yield
        finally:
            process.terminate()
            process.wait(timeout=60)


@contextmanager
def rocksdb_on(mountpoint: Path, *, warm_s: float = 10.0) -> Iterator[RocksDb]:
    """A filled RocksDB database on the filesystem at mountpoint, read for `warm_s` first:
    the first reads after a fill ran a quarter slower than every later run (an unchanged
    configuration measured -26 % against itself when the first run was its baseline's)."""
    database = RocksDb(mountpoint / "db")
    database.fill()
    if warm_s > 0:
        database.p50_us(warm_s)
    yield database
