"""each org's sandbox uid, recorded and unique: two orgs whose ids hashed alike no longer share one

One ADD COLUMN (`orgs.sandbox_uid`) and a unique index; no table is copied. Every org keeps the uid its id hashed to
(`BASE + crc32(id) % 2^24`), which owns its files on a root server, except the newer of orgs that hashed alike: it
gets a uid no org's id hashes to, and its next launch hands its workdir and the volumes it mounts writable to it
(`executors.sandboxing._own`); its workloads running meanwhile keep the old uid until they restart.

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
    ids = [r[0] for r in conn.execute(sa.text("SELECT id FROM orgs ORDER BY created_at, id")).all()]
    hashed = {org_id: BASE + zlib.crc32(org_id.encode()) % SPAN for org_id in ids}
    # First every hash's oldest holder keeps it; only then do the newer twins take uids that are no org's hash, so
    # that none of them lands on a third org's uid, which its files and running sandboxes have.
    owner: dict[int, str] = {}
    for org_id in ids:  # oldest first
        owner.setdefault(hashed[org_id], org_id)
    claimed, free, rows = set(owner), BASE, []
    for org_id in ids:
        uid = hashed[org_id]
        if owner[uid] != org_id:
            while free in claimed:
                free += 1
            claimed.add(free)
            uid = free
        rows.append({"o": org_id, "u": uid})
    if rows:
        conn.execute(sa.text("UPDATE orgs SET sandbox_uid = :u WHERE id = :o"), rows)  # one executemany
    op.create_index(op.f("ix_orgs_sandbox_uid"), "orgs", ["sandbox_uid"], unique=True)


def downgrade() -> None:
    """Downgrade schema (DROP COLUMN is plain on SQLite 3.35+: no table copy)."""
    op.drop_index(op.f("ix_orgs_sandbox_uid"), table_name="orgs")
    op.drop_column("orgs", "sandbox_uid")
