"""ssh_keys: tenants' SSH public keys, for the SSH gateway

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a new table, no change to existing ones."""
    op.create_table(
        "ssh_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("algorithm", sa.String(length=64), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_ssh_keys_user_id_users"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ssh_keys")),
        sa.UniqueConstraint("user_id", "fingerprint", name=op.f("uq_ssh_keys_user_id")),
    )
    with op.batch_alter_table("ssh_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ssh_keys_fingerprint"), ["fingerprint"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("ssh_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ssh_keys_fingerprint"))
    op.drop_table("ssh_keys")
