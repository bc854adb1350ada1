"""a raw window's histograms stored as json, not jsonb

An eBPF window's `operations` — a read and a write histogram of 24-76 slots each, as our
collector sends them — cost PostgreSQL most of what storing the window did: jsonb turns each
of a push's ~9,000 numbers into a numeric. Stored as json the text is checked and kept. It is
read once, by the hourly roll-up, which merges the histograms in Python
(service.telemetry.hourly) and reads the column as text either way; telemetry_hourly keeps
jsonb. The raw table and the set-aside one change together (an hour is set aside with
INSERT … SELECT *).

Both tables are rewritten: on a large raw table, run this in a quiet hour.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("telemetry_windows", "telemetry_windows_set_aside")


def _retype(to: type[postgresql.JSON], existing: type[postgresql.JSON], using: str) -> None:
    for table in TABLES:
        op.alter_column(
            table,
            "operations",
            type_=to(),
            existing_type=existing(),
            existing_nullable=True,
            postgresql_using=using,
        )


def upgrade() -> None:
    _retype(postgresql.JSON, postgresql.JSONB, "operations::json")


def downgrade() -> None:
    _retype(postgresql.JSONB, postgresql.JSON, "operations::jsonb")
