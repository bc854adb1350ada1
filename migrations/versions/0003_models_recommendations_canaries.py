"""model versions, recommendations and scheduled canaries

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSONB = postgresql.JSONB(astext_type=sa.Text())
NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column("device_class", sa.String(16), nullable=False),
        sa.Column("objective", sa.String(16), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("cells", sa.Integer(), nullable=False),
        sa.Column("data_from", sa.DateTime(timezone=True), nullable=True),
        sa.Column("data_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("scores", JSONB, nullable=False),
        sa.Column("parameters", JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
    )
    op.create_index(op.f("ix_model_versions_run_id"), "model_versions", ["run_id"])
    op.create_table(
        "recommendations",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("device_id", sa.UUID(), nullable=False),
        sa.Column("model_version_id", sa.UUID(), nullable=False),
        sa.Column("objective", sa.String(16), nullable=False),
        sa.Column("workload_name", sa.String(128), nullable=False),
        sa.Column("workload_basis", sa.Text(), nullable=False),
        sa.Column("current_config", JSONB, nullable=True),
        sa.Column("recommended_config", JSONB, nullable=False),
        sa.Column("predictions", JSONB, nullable=False),
        sa.Column("confidence", sa.Double(), nullable=False),
        sa.Column("evidence", JSONB, nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("next_canary", JSONB, nullable=True),
        sa.Column("expected_gain", sa.Double(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("decided_by", sa.String(160), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decision_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.CheckConstraint(
            "status IN ('proposed', 'accepted', 'rejected', 'superseded')",
            name=op.f("ck_recommendations_status"),
        ),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
            ondelete="CASCADE",
            name=op.f("fk_recommendations_device_id_devices"),
        ),
        sa.ForeignKeyConstraint(
            ["model_version_id"],
            ["model_versions.id"],
            ondelete="CASCADE",
            name=op.f("fk_recommendations_model_version_id_model_versions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_recommendations")),
    )
    op.create_index("ix_recommendations_device_status", "recommendations", ["device_id", "status"])
    op.create_table(
        "scheduled_canaries",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("run_id", sa.UUID(), nullable=False),
        sa.Column("device_id", sa.UUID(), nullable=False),
        sa.Column("objective", sa.String(16), nullable=False),
        sa.Column("workload_name", sa.String(128), nullable=False),
        sa.Column("workload", JSONB, nullable=False),
        sa.Column("config", JSONB, nullable=False),
        sa.Column("expected_gain", sa.Double(), nullable=False),
        sa.Column("uncertainty", sa.Double(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=NOW, nullable=False),
        sa.CheckConstraint(
            "status IN ('scheduled', 'done', 'cancelled')",
            name=op.f("ck_scheduled_canaries_status"),
        ),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.id"],
            ondelete="CASCADE",
            name=op.f("fk_scheduled_canaries_device_id_devices"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scheduled_canaries")),
    )
    op.create_index(op.f("ix_scheduled_canaries_run_id"), "scheduled_canaries", ["run_id"])
    op.create_index(
        "ix_scheduled_canaries_device_status", "scheduled_canaries", ["device_id", "status"]
    )


def downgrade() -> None:
    op.drop_table("scheduled_canaries")
    op.drop_table("recommendations")
    op.drop_table("model_versions")
