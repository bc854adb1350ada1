"""Opening the database the settings name (or the embedded one), migrated to head."""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from service import db
from service.embedded import EmbeddedPostgres
from service.settings import Settings

log = logging.getLogger(__name__)

# serve's exit status when the server could not start (uvicorn.run's: the port taken, a
# certificate unreadable)
STARTUP_FAILURE = 3


@contextmanager
def database_url(settings: Settings) -> Iterator[str]:
    """The configured URL, or an embedded PostgreSQL started for the duration."""
    if settings.database_url is not None:
        yield settings.database_url
        return
    with EmbeddedPostgres(settings.data_dir) as url:
        yield url


@contextmanager
def open_database(settings: Settings, *, migrate: bool = True) -> Iterator[db.Database]:
    with database_url(settings) as url:
        if migrate:
            log.info("upgrading the schema to head")
            db.upgrade(url)
        database = db.Database(
            db.create_db_engine(
                url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow
            )
        )
        try:
            yield database
        finally:
            database.dispose()


@contextmanager
def exit_cleanly_on_signals() -> Iterator[None]:
    """Make SIGTERM and SIGINT end the process through normal unwinding (exit code 0).

    uvicorn shuts down gracefully on these signals and then re-raises them; with the default
    handlers that would kill the process before the embedded PostgreSQL is stopped.
    """

    def shutdown(signum: int, _: object) -> None:
        raise SystemExit(0)

    previous = {sig: signal.signal(sig, shutdown) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Server(uvicorn.Server):
    """uvicorn's server, which on shutdown first drops the connections with nothing in flight.

    uvicorn ends an idle keep-alive connection on shutdown with `transport.close()`. Over TLS
    that sends close_notify and waits for the client's — up to asyncio's ssl_shutdown_timeout,
    30 s — and a client that is not reading (an agent between two pushes, its connection
    pooled) never answers: a TLS `serve` with one agent connected took 30.6 s to stop, each
    time (tests/agent/test_tls.py), where plain HTTP takes under a second. A connection whose
    last response is complete and written out has nothing to lose: it is aborted, and the
    client's pool finds it closed and opens another. One still sending, or mid-request, is
    left to uvicorn's graceful shutdown."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for connection in list(self.server_state.connections):
            # uvicorn's HTTP protocols: `cycle` is the request in progress or the last one
            cycle = getattr(connection, "cycle", None)
            transport = getattr(connection, "transport", None)
            if transport is None or (cycle is not None and not cycle.response_complete):
                continue
            if transport.get_write_buffer_size() == 0:
                transport.abort()
        await super().shutdown(sockets)
