"""pay by compute used: an allocation billed by usage keeps its idle GPUs' rate and the activity it was charged for

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 09:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("floor_rate_per_hour", "activity_permille_s")


def upgrade() -> None:
    """Plain ADD COLUMNs only (see 0006: a batch table copy of `allocations` on SQLite would drop the old table).
    Allocations opened before are not billed by usage: no floor rate, no activity. Money on SQLite is an INTEGER of
    1e-8 units in a NUMERIC column (see 0012)."""
    op.add_column("allocations", sa.Column("floor_rate_per_hour", sa.Numeric(20, 8), nullable=True))
    op.add_column("allocations", sa.Column("activity_permille_s", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    """Plain DROP COLUMNs (SQLite 3.35+: no table copy, see `upgrade`)."""
    for column in _COLUMNS:
        op.execute(f"ALTER TABLE allocations DROP COLUMN {column}")
