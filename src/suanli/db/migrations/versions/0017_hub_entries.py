"""hub_entries: the public models and datasets of the hub (a new table only)

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-03 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0017"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a new table (no batch copy of any table: see 0006)."""
    op.create_table(
        "hub_entries",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("repo_id", sa.String(length=200), nullable=False),
        sa.Column("revision", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("license", sa.String(length=64), nullable=True),
        sa.Column("source", sa.String(length=1024), nullable=False),
        sa.Column("folder", sa.String(length=256), nullable=False),
        sa.Column("prepared", sa.String(length=256), nullable=True),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hub_entries")),
        sa.UniqueConstraint("kind", "name", name="uq_hub_entries_kind_name"),
        sa.UniqueConstraint("kind", "repo_id", name="uq_hub_entries_kind_repo_id"),
    )


def downgrade() -> None:
    """Downgrade schema (plain DROP TABLE)."""
    op.drop_table("hub_entries")
