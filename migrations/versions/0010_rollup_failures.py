"""an hour that cannot be rolled up no longer stops the telemetry upkeep

telemetry_rollup_failures records each hour whose roll-up failed (the upkeep moves on past
it); telemetry_windows_set_aside keeps the raw windows of an hour that still failed when its
day partition was dropped, so that retention goes on and nothing is lost without a record.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "telemetry_rollup_failures",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="1", nullable=False),
        sa.Column(
            "first_failed_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column(
            "last_failed_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("windows_set_aside", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("hour", name=op.f("pk_telemetry_rollup_failures")),
    )
    # the raw table's columns, defaults and NOT NULLs, unpartitioned, with its key
    op.execute(
        "CREATE TABLE telemetry_windows_set_aside (LIKE telemetry_windows INCLUDING DEFAULTS)"
    )
    op.create_primary_key(
        "pk_telemetry_windows_set_aside",
        "telemetry_windows_set_aside",
        ["device_id", "window_start", "window_end"],
    )


def downgrade() -> None:
    op.drop_table("telemetry_windows_set_aside")
    op.drop_table("telemetry_rollup_failures")
