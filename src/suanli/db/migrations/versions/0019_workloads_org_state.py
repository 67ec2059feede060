"""workloads: an index on (org_id, state), so a submission counts its org's waiting work (max_queued_per_org)
without walking every org's queue or the org's whole history; ledger_entries: an index on (account, tx_id, amount),
so a statement page reads its rows and the balance before them as ranges, not a window over the org's history

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02 21:00:00

"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a plain CREATE INDEX (no batch table copy of workloads: see 0006)."""
    op.create_index("ix_workloads_org_state", "workloads", ["org_id", "state"])
    op.create_index("ix_ledger_entries_account_tx", "ledger_entries", ["account", "tx_id", "amount"])


def downgrade() -> None:
    """Downgrade schema (plain DROP INDEX)."""
    op.drop_index("ix_ledger_entries_account_tx", table_name="ledger_entries")
    op.drop_index("ix_workloads_org_state", table_name="workloads")
