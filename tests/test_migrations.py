from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from service import db
from service.tables import Base
from tests.conftest import create_database, drop_database

NAME = "blkpilot_test_migrations"


@pytest.fixture
def scratch_url(server_url: str) -> Iterator[str]:
    yield create_database(server_url, NAME)
    drop_database(server_url, NAME)


def _tables(url: str) -> set[str]:
    engine = db.create_db_engine(url, pool_size=1)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_downgrade_to_base_and_upgrade_again(scratch_url: str) -> None:
    expected = set(Base.metadata.tables)
    db.upgrade(scratch_url)
    assert expected <= _tables(scratch_url)
    db.downgrade(scratch_url, "base")
    assert _tables(scratch_url) == {"alembic_version"}
    db.upgrade(scratch_url)
    assert expected <= _tables(scratch_url)
    engine = db.create_db_engine(scratch_url, pool_size=1)
    try:
        assert db.current_revision(engine) == db.head_revision()
    finally:
        engine.dispose()


def test_migrations_match_the_tables(scratch_url: str) -> None:
    """A table changed without a migration shows up here as a difference."""
    db.upgrade(scratch_url)
    engine = db.create_db_engine(scratch_url, pool_size=1)
    try:
        with engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        engine.dispose()
    assert differences == []
