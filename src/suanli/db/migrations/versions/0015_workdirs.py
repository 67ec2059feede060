"""workdirs: uploaded and finished jobs' workdirs kept on disk, counted against their org's storage quota; an index
on workloads.finished_at for the sweep that removes them after the retention

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: a new table and a plain CREATE INDEX (no batch table copy of workloads: see 0006)."""
    op.create_table(
        "workdirs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("workload_id", sa.String(length=32), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"], name=op.f("fk_workdirs_org_id_orgs")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_workdirs_user_id_users")),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], name=op.f("fk_workdirs_workload_id_workloads")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workdirs")),
        sa.UniqueConstraint("workload_id", name=op.f("uq_workdirs_workload_id")),
    )
    op.create_index(op.f("ix_workdirs_org_id"), "workdirs", ["org_id"])
    op.create_index("ix_workloads_finished_at", "workloads", ["finished_at"])


def downgrade() -> None:
    """Downgrade schema (plain DROP INDEX and DROP TABLE)."""
    op.drop_index("ix_workloads_finished_at", table_name="workloads")
    op.drop_index(op.f("ix_workdirs_org_id"), table_name="workdirs")
    op.drop_table("workdirs")
