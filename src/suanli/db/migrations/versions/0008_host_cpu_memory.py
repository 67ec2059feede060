"""host CPU and memory: what allocations hold and pay for, and org quotas for them

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ALLOCATION_COLUMNS = ("cpu_milli", "memory_mib", "host_rate_per_hour")
_ORG_COLUMNS = ("quota_cpus", "quota_memory_gib")


def upgrade() -> None:
    """Upgrade schema: plain ADD COLUMNs only (see 0006: a batch table copy of `orgs` or `allocations` on SQLite
    would drop the old table, and with foreign keys on, cascade into the rows that refer to it). Allocations opened
    before held no host CPU or memory on the bill: 0 (their `rate_per_hour` stays what it was); orgs get no limit."""
    op.add_column("allocations", sa.Column("cpu_milli", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("allocations", sa.Column("memory_mib", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("allocations", sa.Column("host_rate_per_hour", sa.Numeric(20, 8), nullable=False, server_default="0"))
    op.add_column("orgs", sa.Column("quota_cpus", sa.Integer(), nullable=True))
    op.add_column("orgs", sa.Column("quota_memory_gib", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Downgrade schema (plain DROP COLUMNs, SQLite 3.35+: no table copy, see `upgrade`)."""
    for column in _ALLOCATION_COLUMNS:
        op.execute(f"ALTER TABLE allocations DROP COLUMN {column}")
    for column in _ORG_COLUMNS:
        op.execute(f"ALTER TABLE orgs DROP COLUMN {column}")
