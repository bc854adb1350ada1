"""Engine, sessions and schema migrations."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from fastapi import Request
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine, create_engine, event, exc, make_url
from sqlalchemy.orm import Session, sessionmaker


def sqlalchemy_url(url: str) -> str:
    """Use psycopg 3 whatever driver the URL names (or none)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"blkpilot needs PostgreSQL, not {parsed.get_backend_name()}")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


# a pooled connection unused this long is checked (SELECT 1) before it is handed out: one
# that PostgreSQL closed meanwhile (a restart, an idle timeout) is replaced, not given to a
# request to fail on. One in steady use is not: a ping on every checkout (pool_pre_ping) was a
# round trip per request — a telemetry push is three — and a connection that breaks while in
# use fails the requests on it at that moment; the pool then renews every connection.
IDLE_PING_S = 5.0


def create_db_engine(url: str, *, pool_size: int = 10, max_overflow: int = 10) -> Engine:
    engine = create_engine(sqlalchemy_url(url), pool_size=pool_size, max_overflow=max_overflow)
    event.listen(engine, "checkin", _returned)
    event.listen(engine, "checkout", _ping_if_idle)
    return engine


def _returned(_dbapi_connection: Any, record: Any) -> None:
    record.info["returned_at"] = time.monotonic()


def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """SQLAlchemy's pessimistic disconnect handling, only where it pays: DisconnectionError
    makes the pool drop this connection and check out another (up to three times)."""
    returned = record.info.get("returned_at")
    if returned is None or time.monotonic() - returned < IDLE_PING_S:
        return  # just made, or in use a moment ago
    try:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        dbapi_connection.rollback()  # the transaction the SELECT began: handed out idle
    except Exception as error:  # psycopg's OperationalError, whatever closed it
        raise exc.DisconnectionError(f"pooled connection unusable: {error}") from error


class Database:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessionmaker = sessionmaker(engine, expire_on_commit=False)
        # the telemetry push's own connections, on the event loop (push_connections): open
        # only while the application runs (its lifespan), None otherwise
        self.pushes: AsyncConnectionPool | None = None

    def dispose(self) -> None:
        self.engine.dispose()


# what PostgreSQL shows of the push connections (pg_stat_activity.application_name)
PUSHES_APPLICATION = "blkpilot-pushes"


@asynccontextmanager
async def push_connections(database: Database, size: int) -> AsyncIterator[None]:
    """While the application runs: `database.pushes`, autocommitting psycopg connections to
    the engine's database that the telemetry push uses on the event loop
    (service.telemetry.service.ingest_pushed) — at most `size` (the engine's pool size: a
    push beyond them waits for one, on the event loop), made as they are needed and closed
    after 10 idle minutes.

    A push the caches answer (its node's devices, its days' partitions) is one statement
    that commits on its own: on the event loop it needs no worker thread, no session and no
    unit of work around it — 0.74-0.85 → 0.51 ms of serve's CPU a one-window push, 2.45-3.05
    → 2.15 ms a 48-window eBPF push (bench/results/ingest.md, 2026-11-29). Opened without
    waiting: a database that is away does not stop the service from starting; the push then
    takes the unit-of-work path, which answers 503."""
    url = database.engine.url.set(drivername="postgresql")
    pool = AsyncConnectionPool(
        url.render_as_string(hide_password=False),
        min_size=0,
        max_size=max(size, 1),
        kwargs={"autocommit": True, "application_name": PUSHES_APPLICATION},
        open=False,
        name="telemetry-pushes",
    )
    await pool.open(wait=False)
    database.pushes = pool
    try:
        yield
    finally:
        database.pushes = None
        await pool.close()


def get_session(request: Request) -> Iterator[Session]:
    """The request's unit of work: committed when the endpoint returns, rolled back on error.

    Used with scope="function" so the commit happens before the response is sent: a client
    never sees success for something that was not stored.
    """
    database: Database = request.app.state.database
    with database.sessionmaker() as session:
        yield from unit_of_work(session)


def unit_of_work(session: Session) -> Iterator[Session]:
    """Yield the session; commit if the caller finished, roll back if it raised."""
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise


# --- Migrations ---------------------------------------------------------------------------


# the partitions of the partitioned tables (migration 0008): the service makes and drops them,
# the schema does not name them
_PARTITION = re.compile(r"^telemetry_(windows|hourly)_(p\d{6,8}|outliers)$")


def include_name(name: str | None, type_: Any, parent_names: Any) -> bool:
    """For Alembic's comparison of the schema with the tables: leave partitions out."""
    return not (type_ == "table" and name is not None and _PARTITION.match(name))


def migrations_dir() -> Path:
    return Path(str(resources.files("migrations")))


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    script = ScriptDirectory.from_config(alembic_config("postgresql://localhost/unused"))
    return script.get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
