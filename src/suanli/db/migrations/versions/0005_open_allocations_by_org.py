"""open allocations by org: a covering partial index for the admission check's running rate

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 08:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index(
        "ix_allocations_org_open",
        "allocations",
        ["org_id", "rate_per_hour"],
        unique=False,
        sqlite_where=sa.text("stopped_at IS NULL"),
        postgresql_where=sa.text("stopped_at IS NULL"),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_allocations_org_open", table_name="allocations")
