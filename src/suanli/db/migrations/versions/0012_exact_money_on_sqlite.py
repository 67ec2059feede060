"""money on SQLite as INTEGER counts of 1e-8 (NUMERIC affinity had stored REAL: floats)

Each stored amount is rounded to the nearest 1e-8 and multiplied out to an integer; the columns' declared type
stays (NUMERIC affinity keeps an INTEGER as it is), so no table is copied. PostgreSQL already stores NUMERIC(20, 8)
exactly: nothing to do there.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 10:30:00

"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = {
    "account_balances": ("balance",),
    "ledger_entries": ("amount",),
    "allocations": ("rate_per_hour", "host_rate_per_hour", "charged"),
    "plans": ("price",),
}


def _set_each(expression: str) -> None:
    """On SQLite, every money column `c` set to `expression` (a format with `{c}`); nothing elsewhere."""
    if op.get_bind().dialect.name != "sqlite":
        return
    for table, columns in COLUMNS.items():
        op.execute(f"UPDATE {table} SET " + ", ".join(f"{c} = " + expression.format(c=c) for c in columns))


def upgrade() -> None:
    _set_each("CAST(ROUND({c} * 100000000) AS INTEGER)")


def downgrade() -> None:
    _set_each("{c} / 100000000.0")
