"""the token that opened an instance proxy session: the session ends with it (revoked or expired)

One ADD COLUMN (`proxy_sessions.token_id`, nullable: sessions opened before it keep their 12 hours). No table is
copied.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-05 03:45:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0027"
down_revision: str | Sequence[str] | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column("proxy_sessions", sa.Column("token_id", sa.String(length=32), nullable=True))


def downgrade() -> None:
    """Downgrade schema (DROP COLUMN is plain on SQLite 3.35+: no table copy)."""
    op.drop_column("proxy_sessions", "token_id")
