"""staged rollouts and their targets

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSONB = postgresql.JSONB(astext_type=sa.Text())
NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("config", JSONB, nullable=False),
        sa.Column("target", JSONB, nullable=False),
        sa.Column("workload_name", sa.String(128), nullable=False),
        sa.Column("canary", JSONB, nullable=False),
        sa.Column("stages", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("stage_specs", postgresql.ARRAY(sa.String(16)), nullable=False),
        sa.Column("serial", sa.String(16), nullable=False),
        sa.Column("max_fail_percentage", sa.Integer(), nullable=False),
        sa.Column("soak_seconds", sa.Double(), nullable=False),
        sa.Column("guardrails", JSONB, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("stage_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("soak_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("status_detail", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(160), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(160), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'paused', 'rolling_back', 'succeeded', 'rolled_back', 'failed')",
            name=op.f("ck_rollouts_status"),
        ),
        sa.CheckConstraint("phase IN ('canary', 'soak')", name=op.f("ck_rollouts_phase")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
    )
    op.create_index("ix_rollouts_status", "rollouts", ["status"])
    op.create_table(
        "rollout_targets",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("rollout_id", sa.UUID(), nullable=False),
        sa.Column("device_id", sa.UUID(), nullable=False),
        sa.Column("node_id", sa.UUID(), nullable=False),
        sa.Column("hostname", sa.String(253), nullable=False),
        sa.Column("device_name", sa.String(64), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("previous_policy", JSONB, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'changing', 'passed', 'failed', 'inconclusive',"
            " 'rolling_back', 'rolled_back', 'restore_failed')",
            name=op.f("ck_rollout_targets_status"),
        ),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollouts.id"],
            name=op.f("fk_rollout_targets_rollout_id_rollouts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
            name=op.f("fk_rollout_targets_device_id_devices"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_rollout_targets_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_targets")),
        sa.UniqueConstraint("rollout_id", "device_id", name=op.f("uq_rollout_targets_rollout_id")),
    )


def downgrade() -> None:
    op.drop_table("rollout_targets")
    op.drop_table("rollouts")
