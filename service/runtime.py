"""Opening the database the settings name (or the embedded one), migrated to head."""

from __future__ import annotations

import logging
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
