"""a recommendation carries its canary's verdict; a failed canary refutes it

canary: the latest canary of the recommended configuration on its device after the
recommendation was made — its observation id, verdict, when, and the measured change of each
metric (relative, with its interval). status gains 'refuted': a failed canary's, which can no
longer be accepted.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("recommendations", sa.Column("canary", postgresql.JSONB()))
    op.drop_constraint(op.f("ck_recommendations_status"), "recommendations", type_="check")
    op.create_check_constraint(
        op.f("ck_recommendations_status"),
        "recommendations",
        "status IN ('proposed', 'accepted', 'rejected', 'superseded', 'refuted')",
    )


def downgrade() -> None:
    op.execute("UPDATE recommendations SET status = 'rejected' WHERE status = 'refuted'")
    op.drop_constraint(op.f("ck_recommendations_status"), "recommendations", type_="check")
    op.create_check_constraint(
        op.f("ck_recommendations_status"),
        "recommendations",
        "status IN ('proposed', 'accepted', 'rejected', 'superseded')",
    )
    op.drop_column("recommendations", "canary")
