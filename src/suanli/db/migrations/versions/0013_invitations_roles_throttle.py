"""invitations, roles with a monthly spend limit per member, signup codes, login throttling

New tables, one ADD COLUMN (`memberships.monthly_spend_limit`, nullable: no limit) and one index on
`ledger_transactions`: no table is copied (see 0006 on why a batch copy must not touch a parent table on SQLite).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 09:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column("memberships", sa.Column("monthly_spend_limit", sa.Numeric(20, 8), nullable=True))
    op.create_index(
        "ix_ledger_transactions_org_user_time", "ledger_transactions", ["org_id", "user_id", "created_at"], unique=False
    )
    op.create_table(
        "invitations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("email", sa.String(length=254), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("monthly_spend_limit", sa.Numeric(20, 8), nullable=True),
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("invited_by", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["invited_by"], ["users.id"], name=op.f("fk_invitations_invited_by_users"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"], name=op.f("fk_invitations_org_id_orgs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invitations")),
        sa.UniqueConstraint("code_hash", name=op.f("uq_invitations_code_hash")),
    )
    op.create_index("ix_invitations_email_state", "invitations", ["email", "state"], unique=False)
    op.create_index(op.f("ix_invitations_org_id"), "invitations", ["org_id"], unique=False)
    op.create_table(
        "signup_codes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("note", sa.String(length=200), nullable=False),
        sa.Column("uses_left", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["created_by"], ["users.id"], name=op.f("fk_signup_codes_created_by_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_signup_codes")),
        sa.UniqueConstraint("code_hash", name=op.f("uq_signup_codes_code_hash")),
    )
    op.create_table(
        "login_throttle",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("tat", sa.DateTime(), nullable=False),
        sa.Column("last_failure_at", sa.DateTime(), nullable=True),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_login_throttle")),
    )
    op.create_index(op.f("ix_login_throttle_expires_at"), "login_throttle", ["expires_at"], unique=False)


def downgrade() -> None:
    """Downgrade schema (DROP COLUMN is plain on SQLite 3.35+: no table copy)."""
    op.drop_index(op.f("ix_login_throttle_expires_at"), table_name="login_throttle")
    op.drop_table("login_throttle")
    op.drop_table("signup_codes")
    op.drop_index(op.f("ix_invitations_org_id"), table_name="invitations")
    op.drop_index("ix_invitations_email_state", table_name="invitations")
    op.drop_table("invitations")
    op.drop_index("ix_ledger_transactions_org_user_time", table_name="ledger_transactions")
    op.execute("ALTER TABLE memberships DROP COLUMN monthly_spend_limit")
