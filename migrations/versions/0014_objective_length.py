"""an objective's name is no longer held to 16 characters

`energy_estimated` filled String(16) exactly; objectives and mixes name themselves with more.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("model_versions", "recommendations", "scheduled_canaries")


def upgrade() -> None:
    for table in TABLES:
        op.alter_column(table, "objective", type_=sa.String(64), existing_nullable=False)


def downgrade() -> None:
    for table in TABLES:
        op.alter_column(table, "objective", type_=sa.String(16), existing_nullable=False)
