from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.orm import Session

from agent.contract.wire import TelemetryBatch
from service import db
from service.security import Principal
from service.tables import Base
from service.telemetry import service as telemetry
from service.telemetry.repository import partitions
from tests.conftest import create_database, drop_database
from tests.factories import create_node, device_inventory, report_inventory, telemetry_window

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
            differences = compare_metadata(
                MigrationContext.configure(connection, opts={"include_name": db.include_name}),
                Base.metadata,
            )
    finally:
        engine.dispose()
    assert differences == []


def test_telemetry_survives_partitioning_both_ways(scratch_url: str) -> None:
    """Windows stored before 0008 move into day partitions (a day each, whatever its date);
    a downgrade moves them back."""
    db.upgrade(scratch_url)
    engine = db.create_db_engine(scratch_url, pool_size=1)
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            node, _ = create_node(session)
            report_inventory(session, node, device_inventory("loop0"))
            principal = Principal(name="node:a", node_id=node.id)
            # an hour apart, back from yesterday's noon: two days
            windows = [telemetry_window(index=-i * 360) for i in range(30)]
            body = {"batch_id": str(uuid.uuid4()), "windows": windows}
            batch = TelemetryBatch.model_validate(body)
            assert telemetry.ingest(session, principal, batch).windows == 30

        def stored() -> list[tuple[datetime, int]]:
            with engine.connect() as connection:
                return sorted(
                    connection.execute(
                        text("SELECT window_start, read_ios FROM telemetry_windows")
                    ).tuples()
                )

        before = stored()
        assert len(before) == 30
        db.downgrade(scratch_url, "0007")
        assert stored() == before
        db.upgrade(scratch_url)
        assert stored() == before
        with engine.connect() as connection:
            days = {p.low.date() for p in partitions(connection, "telemetry_windows")}
        assert {start.astimezone(UTC).date() for start, _ in before} <= days
    finally:
        engine.dispose()
