"""The Alembic migrations build exactly the schema the models describe, on both databases, and re-run safely."""

from __future__ import annotations

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
