"""one recommendation per change: the objectives a recommended configuration serves

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "recommendations", sa.Column("objectives", postgresql.ARRAY(sa.Text()), nullable=True)
    )
    # a recommendation made before served the one objective it was made for
    op.execute("UPDATE recommendations SET objectives = ARRAY[objective]")
    op.alter_column("recommendations", "objectives", nullable=False)


def downgrade() -> None:
    op.drop_column("recommendations", "objectives")
