"""a secret per serving replica: its runtime answers only requests that carry it (the gateway's)

One ADD COLUMN (`endpoint_replicas.secret`, empty for replicas started before it: their runtimes run as they were
started, without the check, until they are replaced). No table is copied.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05 03:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0026"
down_revision: str | Sequence[str] | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column("endpoint_replicas", sa.Column("secret", sa.String(length=64), server_default="", nullable=False))


def downgrade() -> None:
    """Downgrade schema (DROP COLUMN is plain on SQLite 3.35+: no table copy)."""
    op.drop_column("endpoint_replicas", "secret")
