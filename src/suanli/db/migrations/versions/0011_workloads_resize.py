"""workloads.scale_to, restart_reason, restarted_at: running elastic work is resized (`suanli scale`, the policy)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("scale_to", "restart_reason", "restarted_at")


def upgrade() -> None:
    """Upgrade schema: plain nullable ADD COLUMNs and an index (no batch table copy: see 0006)."""
    op.add_column("workloads", sa.Column("scale_to", sa.Integer(), nullable=True))
    op.add_column("workloads", sa.Column("restart_reason", sa.String(length=16), nullable=True))
    op.add_column("workloads", sa.Column("restarted_at", sa.DateTime(), nullable=True))
    op.create_index("ix_workloads_scale_to", "workloads", ["scale_to"])


def downgrade() -> None:
    """Downgrade schema (plain DROP INDEX and DROP COLUMNs, SQLite 3.35+: no table copy)."""
    op.drop_index("ix_workloads_scale_to", table_name="workloads")
    for name in reversed(COLUMNS):
        op.execute(f"ALTER TABLE workloads DROP COLUMN {name}")
