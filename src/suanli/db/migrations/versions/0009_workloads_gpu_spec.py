"""workloads.gpu_spec: an instance started without its GPUs keeps the spec it had with them

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 20:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a plain nullable ADD COLUMN (no batch table copy: see 0006)."""
    op.add_column("workloads", sa.Column("gpu_spec", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Downgrade schema (a plain DROP COLUMN, SQLite 3.35+: no table copy)."""
    op.execute("ALTER TABLE workloads DROP COLUMN gpu_spec")
