"""nightly runs queued through the API

nightly_runs: a nightly job an operator asked for (`POST /api/v1/nightly-runs`, `blkpilot
nightly --url`), claimed and run by the service's nightly worker, with its report or why it
failed.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "nightly_runs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("options", postgresql.JSONB(), nullable=False),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("report", postgresql.JSONB()),
        sa.Column("error", sa.String(2000)),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'done', 'failed')", name=op.f("ck_nightly_runs_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nightly_runs")),
    )
    op.create_index("ix_nightly_runs_status_created", "nightly_runs", ["status", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_nightly_runs_status_created", table_name="nightly_runs")
    op.drop_table("nightly_runs")
