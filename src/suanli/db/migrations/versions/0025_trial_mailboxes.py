"""trial_mailboxes: the mailboxes granted the sign-up trial credit, so that another address of one mailbox gets none

A new table, filled from the trial credits granted so far (the first user of each mailbox; a grant an operator made
counts here, as it cannot be told from a signup's, though later ones do not); no change to existing ones.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05 00:10:00

"""

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from suanli.mail.addresses import mailbox

# revision identifiers, used by Alembic.
revision: str = "0025"
down_revision: str | Sequence[str] | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a new table, filled from the trials granted so far."""
    op.create_table(
        "trial_mailboxes",
        sa.Column("mailbox_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("granted_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_trial_mailboxes_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("mailbox_hash", name=op.f("pk_trial_mailboxes")),
    )
    op.create_index(op.f("ix_trial_mailboxes_user_id"), "trial_mailboxes", ["user_id"], unique=False)
    granted = sa.text(
        "SELECT u.id, u.email, t.created_at FROM users u JOIN ledger_transactions t ON t.key = 'trial:' || u.id "
        "ORDER BY t.created_at, u.id"
    )
    rows, seen = [], set()
    for user_id, email, at in op.get_bind().execute(granted):
        key = hashlib.sha256(mailbox(email).encode()).hexdigest()
        if key not in seen:
            seen.add(key)
            rows.append({"mailbox_hash": key, "user_id": user_id, "granted_at": at})
    if rows:  # the times as the database gave them (text on SQLite), so not through the table's DateTime type
        insert = "INSERT INTO trial_mailboxes (mailbox_hash, user_id, granted_at) VALUES (:mailbox_hash, :user_id, :granted_at)"
        op.get_bind().execute(sa.text(insert), rows)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f("ix_trial_mailboxes_user_id"), table_name="trial_mailboxes")
    op.drop_table("trial_mailboxes")
