"""Alembic environment: migrations run online against the configured PostgreSQL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from service import db
from service.tables import Base

target_metadata = Base.metadata


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection, target_metadata=target_metadata, include_name=db.include_name
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = context.config.attributes.get("connection")
    if given is not None:
        run_migrations(given)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no sqlalchemy.url configured for migrations")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        run_migrations(connection)
    engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("blkpilot migrations run online only")
run_migrations_online()
