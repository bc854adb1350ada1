"""a batch id names one batch: the digest of its content is kept with it

A resend of a batch id with the same content is acknowledged (200); with other content it is
refused (409) instead of being dropped without a word. Ids received before this revision have
no digest and are taken on trust.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("telemetry_batches", sa.Column("digest", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("telemetry_batches", "digest")
