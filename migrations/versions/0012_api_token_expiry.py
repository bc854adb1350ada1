"""operators' API tokens expire and say when they were last used

expires_at: NULL never expires — every token made before this revision, until it is rotated
(`blkpilot token rotate NAME`); new ones default to 90 days. last_used_at: written at most
once a minute per token.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True)))
    op.add_column("api_tokens", sa.Column("last_used_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("api_tokens", "last_used_at")
    op.drop_column("api_tokens", "expires_at")
