"""Tests run on a real PostgreSQL: BLKPILOT_TEST_DATABASE_URL, or an embedded one (pgserver).

The schema is built with `alembic upgrade head`; each test runs inside a transaction that is
rolled back at its end, while the code under test commits and rolls back savepoints inside it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, make_url
from sqlalchemy.orm import Session

from kernel.lab import devices as lab
from service import db
from service.app import create_app
from service.db import Database, get_session, unit_of_work
from service.embedded import EmbeddedPostgres
from service.settings import Settings
from service.telemetry.retention import RetentionPolicy, maintain
from tests.proc import ServiceProcess

# The longest files, longest first (bench/results/suite_time.md, per file from the JUnit report):
# `make test` runs the suite on two workers, a file to a worker (pytest-xdist, --dist loadfile),
# and a long file started last would leave one worker running it alone at the end.
LONGEST_FIRST = (
    "tests/kernel/test_lab.py",
    "tests/test_rollouts.py",
    "tests/models/test_transfer.py",
    "tests/agent/test_live_apps_unseen.py",
    "tests/test_dashboard_browser.py",
    "tests/test_soak.py",
    "tests/agent/test_live_canary.py",
    "tests/test_service_role.py",
    "tests/agent/test_canary.py",
    "tests/models/test_evaluate.py",
    "tests/agent/test_live_apps.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    root = config.rootpath

    def key(item: pytest.Item) -> int:
        return rank.get(item.path.relative_to(root).as_posix(), len(rank))

    items.sort(key=key)  # stable: the order within a file, and among the rest, is kept


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PostgreSQL server's URL (its maintenance database)."""
    given = os.environ.get("BLKPILOT_TEST_DATABASE_URL")
    if given:
        yield given
        return
    embedded = EmbeddedPostgres(tmp_path_factory.mktemp("pg"))
    try:
        yield embedded.start()
    finally:
        embedded.stop()


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(server_url: str, name: str) -> str:
    """A fresh, empty database on the server; returns its URL."""
    with psycopg.connect(_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


@contextmanager
def upkeep_database(server_url: str, name: str, pool_size: int = 2) -> Iterator[Engine]:
    """A database of its own, migrated, for tests whose telemetry upkeep commits and drops
    partitions (no per-test transaction can hold that); the partition cache starts and ends
    empty."""
    from service.telemetry import retention

    url = create_database(server_url, name)
    db.upgrade(url)
    engine = db.create_db_engine(url, pool_size=pool_size)
    retention.CACHE.clear()
    try:
        yield engine
    finally:
        retention.CACHE.clear()
        engine.dispose()
        drop_database(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    name = f"blkpilot_test_{os.getpid()}"
    url = create_database(server_url, name)
    db.upgrade(url)
    # the day partitions the service's upkeep keeps ready (tests' windows are from yesterday)
    engine = db.create_db_engine(url, pool_size=1)
    try:
        maintain(engine, RetentionPolicy())
    finally:
        engine.dispose()
    yield url
    drop_database(server_url, name)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = db.create_db_engine(database_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with engine.connect() as connection:
        outer = connection.begin()
        session = Session(
            bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
        )
        try:
            yield session
        finally:
            session.close()
            outer.rollback()


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(database_url=database_url, data_dir=tmp_path, max_request_bytes=4 * 1024 * 1024)


@pytest.fixture
def app(settings: Settings, engine: Engine, session: Session) -> FastAPI:
    app = create_app(settings, Database(engine))

    def test_session() -> Iterator[Session]:
        # What the test set up beforehand exists before the request, as it would in reality;
        # then the request gets get_session's own unit of work, on the test's transaction.
        session.commit()
        yield from unit_of_work(session)

    app.dependency_overrides[get_session] = test_session
    return app


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:8]


LoopFactory = Callable[..., str]


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[LoopFactory]:
    """Create real loop devices on empty files (tmpfs or disk); detached after the test."""
    made: list[tuple[str, Path]] = []

    def make(*, on: str = "tmpfs", size_mb: int = 64, direct_io: bool = True) -> str:
        directory = lab.TMPFS if on == "tmpfs" else tmp_path
        backing = directory / f"blkpilot-test-{uuid.uuid4().hex[:8]}.img"
        name = lab.attach(backing, size_mb << 20, direct_io=direct_io)
        made.append((name, backing))
        return name

    yield make
    for name, backing in made:
        lab.detach(name, backing)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    """A real `blkpilot serve` on its own embedded database, with an admin token."""
    (tmp_path / "service").mkdir()
    svc = ServiceProcess(tmp_path / "service")
    svc.start()
    svc.create_admin()
    yield svc
    if svc.process is not None:
        assert svc.stop() == 0
