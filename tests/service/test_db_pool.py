"""The service's pool against a real PostgreSQL: a connection PostgreSQL closed while it sat
idle in the pool (a restart, an idle timeout) is replaced before a request gets it — checked
only when it has been idle a while, since a ping on every checkout cost a round trip per
request."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from service import db


def _backend(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(url: str, pid: int) -> None:
    killer = db.create_db_engine(url, pool_size=1)
    try:
        with killer.connect() as connection:
            assert connection.execute(text(f"SELECT pg_terminate_backend({pid})")).scalar_one()
    finally:
        killer.dispose()


def test_a_connection_closed_while_idle_is_replaced_not_handed_out(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = db.create_db_engine(database_url, pool_size=1, max_overflow=0)
    try:
        first = _backend(engine)  # the pool's one connection, back in the pool
        _terminate(database_url, first)
        monkeypatch.setattr(db, "IDLE_PING_S", 0.0)  # it has been idle long enough
        again = _backend(engine)
        assert again != first  # a new backend: the dead one was checked and dropped
        with engine.connect() as connection:  # and the new one is handed out idle
            assert connection.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


def test_a_connection_in_steady_use_is_not_pinged(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within IDLE_PING_S of its last use a connection is handed out as it is — so a backend
    killed in that moment fails the request on it (what the ping saves, and its price)."""
    engine = db.create_db_engine(database_url, pool_size=1, max_overflow=0)
    try:
        first = _backend(engine)
        _terminate(database_url, first)
        monkeypatch.setattr(db, "IDLE_PING_S", 3600.0)
        with pytest.raises(OperationalError):
            _backend(engine)
        assert _backend(engine) != first  # the pool renewed it after the failure
    finally:
        engine.dispose()
