"""node tokens expire, rotate (with a grace period for the one replaced) and can be revoked

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # tokens issued before expiry existed get the default lifetime from now: their agents
    # renew them like any other
    op.add_column(
        "nodes",
        sa.Column(
            "token_expires_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now() + interval '30 days'"),
        ),
    )
    op.alter_column("nodes", "token_expires_at", server_default=None)
    op.add_column("nodes", sa.Column("previous_token_sha256", sa.String(64), nullable=True))
    op.create_unique_constraint(
        op.f("uq_nodes_previous_token_sha256"), "nodes", ["previous_token_sha256"]
    )
    op.add_column(
        "nodes", sa.Column("previous_token_expires_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("nodes", sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "revoked_at")
    op.drop_column("nodes", "previous_token_expires_at")
    op.drop_constraint(op.f("uq_nodes_previous_token_sha256"), "nodes", type_="unique")
    op.drop_column("nodes", "previous_token_sha256")
    op.drop_column("nodes", "token_expires_at")
