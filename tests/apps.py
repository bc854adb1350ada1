"""Real applications on lab devices, for the live canary's tests and benchmarks: PostgreSQL
(the embedded server's own binaries) with pgbench on a filesystem on a loop device, and
prometheus-postgres-exporter (Debian) in front of it, exporting the WAL's sync count and time
— the part of a commit the device decides — for the canary's application SLI; RocksDB's
db_bench (Debian's rocksdb-tools) reading a database on such a filesystem with direct reads;
and two applications nobody tuned the canary to: MariaDB's InnoDB (16 KiB pages, a redo log,
a doublewrite buffer) under sysbench's paced read-write load, with prometheus-mysqld-exporter
exporting every query's time (the query_response_time plugin), and Redis appending every write
to its append-only file with an fsync, under redis-benchmark."""

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
from typing import Any

import httpx

from agent.contract.sli import AppSli

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


def _stop(process: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGTERM, a wait of `timeout`, then SIGKILL: an application stopped however it answers."""
    process.terminate()
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    if process.poll() is None:
        process.kill()
        process.wait()


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
        _stop(process)


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
    command = [EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--disable-default-metrics",
               "--disable-settings-metrics", f"--extend.query-path={queries}"]  # fmt: skip
    with _exporter(command, env, port, "pg_stat_wal_wal_sync", workdir) as url:
        yield url


@contextmanager
def _exporter(
    command: list[str], env: dict[str, str], port: int, series: str, workdir: Path
) -> Iterator[str]:
    """A Prometheus exporter on loopback until the context ends; yields its URL once it
    exports `series`."""
    log = workdir / f"{Path(command[0]).name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the exporter exited: {log.read_text()}")
            with suppress(httpx.TransportError):
                if series in httpx.get(url, timeout=2).text:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {series} at {url} within 30 s: {log.read_text()[-500:]}")
            time.sleep(0.2)
        yield url
    finally:
        _stop(process)


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


# --- MariaDB (InnoDB) under sysbench ---------------------------------------------------------


@dataclass
class MariaDb:
    """A MariaDB server of its own on a filesystem: InnoDB with its defaults — 16 KiB pages, a
    redo log, the doublewrite buffer — a 32 MiB buffer pool (the tables are 8x that, so pages
    are read from the device) and O_DIRECT; each commit syncs the redo log. Four sysbench
    tables. Its traffic is paced (`rate` transactions a second from `threads` clients): the
    clients set the pace, not the device — an open-loop application."""

    socket: Path
    tables: int = 4
    table_size: int = 100_000

    def sysbench(self, *extra: str) -> list[str]:
        return [
            "sysbench", "oltp_read_write", "--db-driver=mysql", f"--mysql-socket={self.socket}",
            "--mysql-user=root", f"--tables={self.tables}", f"--table-size={self.table_size}",
            *extra,
        ]  # fmt: skip

    def run(self, seconds: float, *, rate: int = 100, threads: int = 4) -> tuple[float, float]:
        """sysbench alone for that long: (its p99 latency in ms, transactions per second)."""
        done = subprocess.run(
            self.sysbench(
                f"--threads={threads}", f"--rate={rate}", f"--time={seconds:.0f}",
                "--percentile=99", "run",
            ),
            capture_output=True, text=True, timeout=seconds + 120, check=False,
        )  # fmt: skip
        p99 = re.search(r"99th percentile:\s+([\d.]+)", done.stdout)
        tps = re.search(r"transactions:\s+\d+\s+\(([\d.]+) per sec", done.stdout)
        if done.returncode != 0 or not p99 or not tps:
            raise RuntimeError(f"sysbench exit {done.returncode}: {done.stderr[-300:]!r}")
        return float(p99.group(1)), float(tps.group(1))

    @contextmanager
    def traffic(self, *, rate: int = 100, threads: int = 4) -> Iterator[None]:
        """The paced read-write load until the context ends."""
        process = subprocess.Popen(
            self.sysbench(f"--threads={threads}", f"--rate={rate}", "--time=86400", "run"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(2)
            yield
        finally:
            _stop(process)


MYSQLD_EXPORTER = "/usr/bin/prometheus-mysqld-exporter"
# MariaDB's query_response_time plugin, as the exporter names it: every query's time, summed
QUERY_TIME = "mysql_info_schema_query_response_time_seconds"


def mariadb_sli(url: str) -> AppSli:
    """The SLI a MariaDB operator would name: every query's mean time (the plugin's sum over its
    count), deciding the canary — it is all the database does, where its block-level p99
    swings with the doublewrite bursts each interval holds or not."""
    return AppSli(
        url=url, kind="ratio", metric=f"{QUERY_TIME}_sum", per=f"{QUERY_TIME}_count",
        decides=True, min_interval_s=1.0, description="seconds per query (query_response_time)",
    )  # fmt: skip


@contextmanager
def mysqld_exporter(database: MariaDb, workdir: Path) -> Iterator[str]:
    """prometheus-mysqld-exporter (Debian) on loopback in front of the server, exporting the
    query_response_time plugin's histogram of every query's time (mariadb_on installs it);
    yields its URL."""
    port = _free_port()
    env = {**os.environ, "DATA_SOURCE_NAME": f"root@unix({database.socket})/"}
    command = [MYSQLD_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
               "--collect.info_schema.query_response_time", "--no-collect.slave_status",
               "--no-collect.global_variables", "--no-collect.info_schema.innodb_cmp",
               "--no-collect.info_schema.innodb_cmpmem"]  # fmt: skip
    with _exporter(command, env, port, f"{QUERY_TIME}_count", workdir) as url:
        yield url


@contextmanager
def mariadb_on(mountpoint: Path, *, warm_s: float = 10.0) -> Iterator[MariaDb]:
    """A MariaDB server (Debian's) whose data directory is on the filesystem at mountpoint,
    listening on a Unix socket only, its sysbench tables prepared and read for `warm_s`;
    stopped at exit."""
    data = mountpoint / "mariadb"
    socket_path = mountpoint / "mariadb.sock"
    subprocess.run(
        ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
         "--auth-root-authentication-method=normal", "--skip-test-db"],
        capture_output=True, check=True, timeout=300,
    )  # fmt: skip
    log = mountpoint / "mariadb.err"
    server = subprocess.Popen(
        ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={socket_path}",
         "--skip-networking", "--user=root", f"--pid-file={mountpoint / 'mariadb.pid'}",
         "--innodb-buffer-pool-size=32M", "--innodb-flush-method=O_DIRECT",
         "--innodb-flush-log-at-trx-commit=1", "--innodb-log-file-size=48M",
         f"--log-error={log}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            ping = subprocess.run(
                ["mariadb-admin", "--no-defaults", "-S", str(socket_path), "-uroot", "ping"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if ping.returncode == 0:
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mariadbd did not start: {log.read_text()[-500:]}")
            time.sleep(0.5)
        subprocess.run(
            ["mariadb", "--no-defaults", "-S", str(socket_path), "-uroot", "-e",
             "CREATE DATABASE sbtest; INSTALL SONAME 'query_response_time';"
             " SET GLOBAL query_response_time_stats = ON"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        database = MariaDb(socket_path)
        subprocess.run(
            database.sysbench("--threads=2", "prepare"), capture_output=True, check=True,
            timeout=900,
        )  # fmt: skip
        if warm_s > 0:
            database.run(warm_s)
        yield database
    finally:
        _stop(server, timeout=120)


# --- Redis with its append-only file ----------------------------------------------------------


@dataclass
class Redis:
    """A Redis server of its own whose append-only file is synced on every write
    (appendfsync always): a key-value store whose writes are an append and an fsync each, on
    a Unix socket; redis-benchmark's SETs from four clients, each waiting for its answer — a
    closed-loop application, and all writes."""

    socket: Path
    backup: Path | None = None  # a file a backup reads (direct) beside the clients' SETs

    def benchmark(self, *extra: str) -> list[str]:
        return [
            "redis-benchmark", "-s", str(self.socket), "-t", "set", "-c", "4", "-d", "512",
            "-r", "100000", *extra,
        ]  # fmt: skip

    def run(self, seconds: float) -> tuple[float, float]:
        """redis-benchmark for about that long (beside the backup, where there is one): (its
        p99 latency in ms, SETs a second)."""
        rate = 2_000  # about what this host does; the count sets the length
        with self._backup():
            done = subprocess.run(
                self.benchmark("-n", str(int(rate * seconds)), "--csv"),
                capture_output=True, text=True, timeout=seconds * 10 + 120, check=False,
            )  # fmt: skip
        rows = [line.replace('"', "").split(",") for line in done.stdout.splitlines()]
        found = [row for row in rows if row and row[0] == "SET"]
        if done.returncode != 0 or not found:
            raise RuntimeError(f"redis-benchmark exit {done.returncode}: {done.stderr[-300:]!r}")
        header = next(row for row in rows if row and row[0] == "test")
        values = dict(zip(header, found[0], strict=False))
        return float(values["p99_latency_ms"]), float(values["rps"])

    @contextmanager
    def traffic(self) -> Iterator[None]:
        """SETs (and the backup) until the context ends."""
        with self._backup():
            process = subprocess.Popen(
                self.benchmark("-n", "2000000000", "-q"),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                time.sleep(1)
                yield
            finally:
                process.terminate()
                process.wait(timeout=30)

    @contextmanager
    def _backup(self) -> Iterator[None]:
        """dd reading the backup file over and over, direct, 128 KiB at a time."""
        if self.backup is None:
            yield
            return
        reader = subprocess.Popen(
            ["sh", "-c", f"while :; do dd if='{self.backup}' of=/dev/null bs=128k"
             " iflag=direct 2>/dev/null; done"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            yield
        finally:
            os.killpg(reader.pid, 15)
            reader.wait(timeout=30)


@contextmanager
def redis_on(mountpoint: Path, *, backup: Path | None = None) -> Iterator[Redis]:
    """A Redis server (Debian's) with its append-only file on the filesystem at mountpoint,
    on a Unix socket only (no TCP port); shut down at exit. With `backup`, a file a backup
    reads while the clients write."""
    directory = mountpoint / "redis"
    directory.mkdir()
    socket_path = mountpoint / "redis.sock"
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(socket_path), "--dir",
         str(directory), "--appendonly", "yes", "--appendfsync", "always", "--save", "",
         "--logfile", str(mountpoint / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.1)
        yield Redis(socket_path, backup)
    finally:
        _stop(server, timeout=60)
