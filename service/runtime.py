"""Opening the database the settings name (or the embedded one), migrated to head."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from service import db
from service.embedded import EmbeddedPostgres
from service.settings import Settings

log = logging.getLogger(__name__)


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
