"""each org's sandbox uid, recorded and unique: two orgs whose ids hashed alike no longer share one

One ADD COLUMN (`orgs.sandbox_uid`) and a unique index; no table is copied. Every org keeps the uid its id hashed to
(`BASE + crc32(id) % 2^24`), which owns its files on a root server, except the newer of orgs that hashed alike: it
gets the next free uid, and its next launch hands its workdir and volumes to it (`executors.sandboxing._own`).

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-05 06:00:00

"""

import zlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0028"
down_revision: str | Sequence[str] | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BASE, SPAN = 0x10000000, 1 << 24  # as sandbox.bwrap has them: a migration keeps its own copy


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column("orgs", sa.Column("sandbox_uid", sa.Integer(), nullable=True))
    conn = op.get_bind()
    taken: set[int] = set()
    for (org_id,) in conn.execute(sa.text("SELECT id FROM orgs ORDER BY created_at, id")).all():
        uid = BASE + zlib.crc32(org_id.encode()) % SPAN
        while uid in taken:
            uid = BASE + (uid - BASE + 1) % SPAN
        taken.add(uid)
        conn.execute(sa.text("UPDATE orgs SET sandbox_uid = :u WHERE id = :o"), {"u": uid, "o": org_id})
    op.create_index(op.f("ix_orgs_sandbox_uid"), "orgs", ["sandbox_uid"], unique=True)


def downgrade() -> None:
    """Downgrade schema (DROP COLUMN is plain on SQLite 3.35+: no table copy)."""
    op.drop_index(op.f("ix_orgs_sandbox_uid"), table_name="orgs")
    op.drop_column("orgs", "sandbox_uid")
