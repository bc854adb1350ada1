"""telemetry windows: node CPU, context switches, every power source

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("telemetry_windows", sa.Column("cpu_utilisation", sa.Double(), nullable=True))
    op.add_column(
        "telemetry_windows", sa.Column("context_switches_per_s", sa.Double(), nullable=True)
    )
    op.add_column("telemetry_windows", sa.Column("power_source", sa.String(16), nullable=True))
    op.add_column(
        "telemetry_windows",
        sa.Column("power_readings", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("telemetry_windows", "power_readings")
    op.drop_column("telemetry_windows", "power_source")
    op.drop_column("telemetry_windows", "context_switches_per_s")
    op.drop_column("telemetry_windows", "cpu_utilisation")
