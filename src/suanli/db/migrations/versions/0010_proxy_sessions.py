"""proxy_sessions: tickets and browser sessions of the instance proxy (JupyterLab, ports)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 23:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a new table, no change to existing ones."""
    op.create_table(
        "proxy_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("workload_id", sa.String(length=32), nullable=False),
        sa.Column("target", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("used_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_proxy_sessions_user_id_users"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name=op.f("fk_proxy_sessions_workload_id_workloads"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_proxy_sessions")),
    )
    with op.batch_alter_table("proxy_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_proxy_sessions_expires_at"), ["expires_at"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("proxy_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_proxy_sessions_expires_at"))
    op.drop_table("proxy_sessions")
