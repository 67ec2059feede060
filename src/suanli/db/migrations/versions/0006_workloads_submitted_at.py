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
    """Upgrade schema."""
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("submitted_at", sa.DateTime(), nullable=True))
    op.execute("UPDATE workloads SET submitted_at = queued_at")
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.alter_column("submitted_at", existing_type=sa.DateTime(), nullable=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_column("submitted_at")
