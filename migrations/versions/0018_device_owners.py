"""what else sets a device's queue attributes, and whether a policy yields to it

devices.owners: the udev rules and TuneD profile that set the device's queue attributes
(scheduler, read-ahead, the scheduler's tunables) besides blkpilot, as its agent last reported
them (agent.owners) — shown as "owned by: …" and read before blkpilot applies anything.

policies.owners: where such an owner sets what the policy sets, 'take_over' (apply, and again
once per change the other owner makes) or 'yield' (the other owner's setting stands).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "devices",
        sa.Column("owners", postgresql.JSONB(), nullable=False, server_default="[]"),
    )
    op.add_column(
        "policies",
        sa.Column("owners", sa.String(16), nullable=False, server_default="take_over"),
    )


def downgrade() -> None:
    op.drop_column("policies", "owners")
    op.drop_column("devices", "owners")
