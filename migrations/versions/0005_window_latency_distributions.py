"""telemetry windows carry latency distributions from eBPF

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSONB = postgresql.JSONB(astext_type=sa.Text())


def upgrade() -> None:
    # where the latency figures come from: "ebpf" (distributions) or "diskstats" (means only)
    op.add_column(
        "telemetry_windows",
        sa.Column("latency_source", sa.String(16), nullable=False, server_default="diskstats"),
    )
    op.add_column(
        "telemetry_windows",
        sa.Column("latency_note", sa.Text(), nullable=False, server_default=""),
    )
    # per operation: count, device/queue time and size histograms, p50/p95/p99/p99.9
    op.add_column("telemetry_windows", sa.Column("operations", JSONB, nullable=True))
    # the device-time percentiles over reads and writes, for charts and queries
    for name in ("p50_us", "p99_us", "p999_us"):
        op.add_column("telemetry_windows", sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    for name in ("p999_us", "p99_us", "p50_us", "operations", "latency_note", "latency_source"):
        op.drop_column("telemetry_windows", name)
