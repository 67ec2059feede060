"""workloads.submitted_at: a retried workload keeps its place in the queue

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 16:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema.

    No batch (table-copying) operations: on SQLite, copying `workloads` drops the old table, and with foreign keys
    on that deletes every `workload_events` row through its ON DELETE CASCADE. A NOT NULL column with a constant
    default is a plain ADD COLUMN on both databases. A job was submitted when it was created (it never starts
    again); an instance may have been started again since, which its `queued_at` may or may not say: it takes that.
    """
    op.add_column(
        "workloads", sa.Column("submitted_at", sa.DateTime(), nullable=False, server_default="1970-01-01 00:00:00")
    )
    op.execute("UPDATE workloads SET submitted_at = CASE WHEN kind = 'job' THEN created_at ELSE queued_at END")
    if op.get_bind().dialect.name != "sqlite":  # SQLite cannot drop a default without copying the table
        op.alter_column("workloads", "submitted_at", server_default=None)


def downgrade() -> None:
    """Downgrade schema (a plain DROP COLUMN, SQLite 3.35+: no table copy, see `upgrade`)."""
    op.execute("ALTER TABLE workloads DROP COLUMN submitted_at")
