"""allocations: an index on (org_id, started_at, id), so a page of the usage statement (newest first, by start
then id, after a cursor) is a range read, not a sort of every older allocation of the org

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03 06:40:00

"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a plain CREATE INDEX (no batch table copy of allocations: see 0006)."""
    op.create_index("ix_allocations_org_started", "allocations", ["org_id", "started_at", "id"])


def downgrade() -> None:
    """Downgrade schema (plain DROP INDEX)."""
    op.drop_index("ix_allocations_org_started", table_name="allocations")
