"""console_secrets: a secret a console form made waits in the database, sealed, for the page that shows it once,
so any process of `suanli server --workers N` can show it

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04 07:20:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a new table, no change to existing ones."""
    op.create_table(
        "console_secrets",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("page", sa.String(length=64), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_secrets")),
    )
    with op.batch_alter_table("console_secrets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_console_secrets_owner"), ["owner"], unique=False)
        batch_op.create_index(batch_op.f("ix_console_secrets_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_console_secrets_expires_at"), ["expires_at"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("console_secrets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_console_secrets_expires_at"))
        batch_op.drop_index(batch_op.f("ix_console_secrets_created_at"))
        batch_op.drop_index(batch_op.f("ix_console_secrets_owner"))
    op.drop_table("console_secrets")
