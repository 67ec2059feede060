"""Alembic environment: runs on the engine the caller hands over (see suanli.db.migrate).

Several server processes may start at once on one database (`suanli server --workers N`, or replicas), and
each migrates on start: the migration runs in one transaction under a lock — a transaction-scoped advisory lock
on PostgreSQL, the write lock (`BEGIN IMMEDIATE`) on SQLite — so the second waits and then finds the schema
current."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from suanli.db.models import Base

MIGRATION_LOCK = 0x5A4E_4C49  # any constant shared by every suanli process

engine = context.config.attributes["engine"]
# One transaction for the whole upgrade, begun here, so the lock is held from reading the current revision to
# the last step. (Alembic would otherwise run each step on SQLite in a transaction of its own: between two
# steps another process could take the lock, read the same revision and apply the next step twice.)
with engine.execution_options(writes=True).connect() as connection, connection.begin():
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():  # inside ours: alembic begins and commits nothing itself
        context.run_migrations()
