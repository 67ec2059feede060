"""volumes: persistent volumes of an org and their versions (new tables only)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: two new tables (no parent table is altered: see 0006)."""
    op.create_table(
        "volumes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("backend", sa.String(length=8), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("used_bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("snapshot_bytes", sa.BigInteger(), nullable=False),
        sa.Column("last_version", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("measured_at", sa.DateTime(), nullable=True),
        sa.Column("billed_until", sa.DateTime(), nullable=False),
        sa.Column("unpaid_since", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"], name=op.f("fk_volumes_org_id_orgs")),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], name=op.f("fk_volumes_created_by_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_volumes")),
        sa.UniqueConstraint("org_id", "name", name=op.f("uq_volumes_org_id")),
    )
    op.create_index(op.f("ix_volumes_org_id"), "volumes", ["org_id"])
    op.create_table(
        "volume_versions",
        sa.Column("volume_id", sa.String(length=32), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("message", sa.String(length=200), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("added_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["volume_id"], ["volumes.id"], name=op.f("fk_volume_versions_volume_id_volumes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], name=op.f("fk_volume_versions_created_by_users")),
        sa.PrimaryKeyConstraint("volume_id", "number", name=op.f("pk_volume_versions")),
    )


def downgrade() -> None:
    """Downgrade schema (plain DROP TABLE)."""
    op.drop_table("volume_versions")
    op.drop_index(op.f("ix_volumes_org_id"), table_name="volumes")
    op.drop_table("volumes")
