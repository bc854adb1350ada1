"""Readiness: the database answers, and at which schema revision."""

from __future__ import annotations

from service.db import Database, current_revision
from service.ops import repository


def schema_revision(database: Database) -> str | None:
    """The database's schema revision; raises if the database does not answer."""
    repository.ping(database.engine)
    return current_revision(database.engine)
