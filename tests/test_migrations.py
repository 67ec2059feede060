"""The Alembic migrations build exactly the schema the models describe, on both databases, and re-run safely."""

from __future__ import annotations

import subprocess
import sys
import time

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from suanli.db.engine import Database
from suanli.db.migrate import migrate
from suanli.db.models import Base


def test_migrations_match_the_models(db_url: str) -> None:
    db = Database(db_url)
    try:
        migrate(db.engine)
        migrate(db.engine)  # every server start runs this: a second run is a no-op
        with db.engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": False})
            diff = compare_metadata(ctx, Base.metadata)
            assert diff == [], f"models and migrations differ: {diff}"
            assert ctx.get_current_revision() is not None
        assert set(Base.metadata.tables) <= set(inspect(db.engine).get_table_names())
    finally:
        db.dispose()


def test_processes_starting_together_migrate_once(db_url: str) -> None:
    """`suanli server --workers N` starts N processes that all migrate on start, at the same moment."""
    code = (
        "import sys, time; from suanli.db.engine import Database; from suanli.db.migrate import migrate\n"
        "db = Database(sys.argv[1]); t = float(sys.argv[2])\n"
        "time.sleep(max(0.0, t - time.time())); migrate(db.engine); print('ok')"
    )
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, db_url, str(start)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip() == b"ok", err.decode()[-2000:]
    db = Database(db_url)
    try:
        with db.engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() is not None
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        db.dispose()
