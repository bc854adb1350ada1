"""an accepted recommendation is verified by a one-device rollout; undo in one step

recommendations.rollout_id: the rollout that tries the accepted configuration under a canary;
status gains 'verifying' (its rollout runs), 'kept' (it passed its canary and soak),
'rolled_back' (the device went back: a failed or, by default, inconclusive canary, or a
guardrail), 'applied' (pinned without a canary, an operator's audited choice) and 'reverted'
(undone). 'accepted' stays for recommendations accepted before this revision.

policies.release_when_applied: a policy that only puts a device back as it was before
blkpilot changed it; once its agent reports it applied, the policy is cleared and the device
is unmanaged again, as it was.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FOREIGN_KEY = "fk_recommendations_rollout_id_rollouts"  # the models' naming convention
BEFORE = "('proposed', 'accepted', 'rejected', 'superseded', 'refuted')"
AFTER = (
    "('proposed', 'accepted', 'verifying', 'kept', 'rolled_back', 'applied', 'reverted',"
    " 'rejected', 'superseded', 'refuted')"
)


def _status(allowed: str) -> None:
    op.drop_constraint(op.f("ck_recommendations_status"), "recommendations", type_="check")
    op.create_check_constraint(
        op.f("ck_recommendations_status"), "recommendations", f"status IN {allowed}"
    )


def upgrade() -> None:
    op.add_column(
        "recommendations",
        sa.Column(
            "rollout_id",
            sa.Uuid(),
            sa.ForeignKey(
                "rollouts.id", ondelete="SET NULL", name="fk_recommendations_rollout_id_rollouts"
            ),
        ),
    )
    op.create_index("ix_recommendations_rollout", "recommendations", ["rollout_id"])
    _status(AFTER)
    op.add_column(
        "policies",
        sa.Column("release_when_applied", sa.Boolean(), nullable=False, server_default="false"),
    )


def downgrade() -> None:
    op.drop_column("policies", "release_when_applied")
    op.execute(
        "UPDATE recommendations SET status = 'accepted'"
        " WHERE status IN ('verifying', 'kept', 'applied')"
    )
    op.execute(
        "UPDATE recommendations SET status = 'rejected' WHERE status IN ('rolled_back', 'reverted')"
    )
    _status(BEFORE)
    op.drop_index("ix_recommendations_rollout", "recommendations")
    op.drop_column("recommendations", "rollout_id")
