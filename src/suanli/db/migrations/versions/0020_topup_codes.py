"""top-up codes: operators' batches and their codes (stored as SHA-256 only)

New tables only: no table is copied (see 0006 on why a batch copy must not touch a parent table on SQLite). Money
columns are declared NUMERIC(20, 8) like every other (on SQLite `Money` stores an INTEGER of 1e-8 units in them).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02 23:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "topup_batches",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("amount", sa.Numeric(20, 8), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("note", sa.String(length=200), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=True),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["created_by"], ["users.id"], name=op.f("fk_topup_batches_created_by_users")),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"], name=op.f("fk_topup_batches_org_id_orgs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_topup_batches")),
    )
    op.create_table(
        "topup_codes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("batch_id", sa.String(length=32), nullable=False),
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("hint", sa.String(length=8), nullable=False),
        sa.Column("redeemed_at", sa.DateTime(), nullable=True),
        sa.Column("redeemed_by", sa.String(length=32), nullable=True),
        sa.Column("redeemed_org", sa.String(length=32), nullable=True),
        sa.Column("tx_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("voided_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["batch_id"], ["topup_batches.id"], name=op.f("fk_topup_codes_batch_id_topup_batches")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_topup_codes")),
        sa.UniqueConstraint("code_hash", name=op.f("uq_topup_codes_code_hash")),
    )
    op.create_index(op.f("ix_topup_codes_batch_id"), "topup_codes", ["batch_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f("ix_topup_codes_batch_id"), table_name="topup_codes")
    op.drop_table("topup_codes")
    op.drop_table("topup_batches")
