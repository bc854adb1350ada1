"""present devices counted by triggers, so that no page or scrape scans the fleet

device_counts holds +1/-1 rows per (class, current scheduler, completion mode) of present
devices. Triggers keep it:
- on devices: an insert adds the device's key, an update that changes presence, class or
  scheduler moves it, a delete removes it (BEFORE DELETE: the cascade deletes the device's
  policy after that, and the completion mode lives in the policy);
- on policies: a change of the completion mode in force (the applied configuration's, else the
  desired one's, else interrupt) moves a present device's key. It locks the device row first, so
  that a concurrent scheduler change and completion change (each reading the other's table)
  cannot both count from the old state: one waits for the other and reads what it committed.
The service folds the rows together in its upkeep (service/devices/repository.py).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the completion mode in force for a policy row (the agent's report, else the desired config)
_IN_FORCE = "coalesce(coalesce({row}.applied_config, {row}.config) ->> 'completion', 'interrupt')"

FUNCTIONS = f"""
CREATE FUNCTION device_counts_completion(device uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT {_IN_FORCE.format(row="p")} FROM policies p WHERE p.device_id = device),
        'interrupt')
$$;

CREATE FUNCTION device_counts_on_devices() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.present THEN
        INSERT INTO device_counts VALUES (OLD.device_class, coalesce(OLD.current_scheduler,
            'unknown'), device_counts_completion(OLD.id), -1);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.present THEN
        INSERT INTO device_counts VALUES (NEW.device_class, coalesce(NEW.current_scheduler,
            'unknown'), device_counts_completion(NEW.id), 1);
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION device_counts_on_policies() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    device record;
    was text := 'interrupt';
    now_ text := 'interrupt';
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        was := {_IN_FORCE.format(row="OLD")};
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        now_ := {_IN_FORCE.format(row="NEW")};
    END IF;
    IF was = now_ THEN
        RETURN NULL;
    END IF;
    SELECT d.device_class, coalesce(d.current_scheduler, 'unknown') AS scheduler INTO device
        FROM devices d
        WHERE d.id = CASE WHEN TG_OP = 'DELETE' THEN OLD.device_id ELSE NEW.device_id END
          AND d.present
        FOR NO KEY UPDATE;
    IF FOUND THEN
        INSERT INTO device_counts VALUES
            (device.device_class, device.scheduler, was, -1),
            (device.device_class, device.scheduler, now_, 1);
    END IF;
    RETURN NULL;
END $$;
"""  # noqa: S608 (constants only)

TRIGGERS = """
CREATE TRIGGER device_counts_insert AFTER INSERT ON devices
    FOR EACH ROW EXECUTE FUNCTION device_counts_on_devices();
CREATE TRIGGER device_counts_update AFTER UPDATE ON devices
    FOR EACH ROW WHEN (OLD.present IS DISTINCT FROM NEW.present
        OR OLD.device_class IS DISTINCT FROM NEW.device_class
        OR OLD.current_scheduler IS DISTINCT FROM NEW.current_scheduler)
    EXECUTE FUNCTION device_counts_on_devices();
CREATE TRIGGER device_counts_delete BEFORE DELETE ON devices
    FOR EACH ROW EXECUTE FUNCTION device_counts_on_devices();
CREATE TRIGGER device_counts_policies AFTER INSERT OR UPDATE OR DELETE ON policies
    FOR EACH ROW EXECUTE FUNCTION device_counts_on_policies();
"""


def upgrade() -> None:
    op.create_table(
        "device_counts",
        sa.Column("device_class", sa.String(length=16), nullable=False),
        sa.Column("scheduler", sa.String(length=16), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
    )
    # no device changes while the counts start from what is there
    op.execute("LOCK TABLE devices, policies IN SHARE ROW EXCLUSIVE MODE")
    op.execute(FUNCTIONS)
    op.execute(TRIGGERS)
    op.execute(
        "INSERT INTO device_counts"  # noqa: S608
        " SELECT d.device_class, coalesce(d.current_scheduler, 'unknown'),"
        f" {_IN_FORCE.format(row='p')}, count(*)"
        " FROM devices d LEFT JOIN policies p ON p.device_id = d.id WHERE d.present"
        " GROUP BY 1, 2, 3"
    )


def downgrade() -> None:
    for trigger, table in (
        ("device_counts_insert", "devices"),
        ("device_counts_update", "devices"),
        ("device_counts_delete", "devices"),
        ("device_counts_policies", "policies"),
    ):
        op.execute(f"DROP TRIGGER {trigger} ON {table}")
    for function in ("on_policies()", "on_devices()", "completion(uuid)"):
        op.execute(f"DROP FUNCTION device_counts_{function}")
    op.drop_table("device_counts")
