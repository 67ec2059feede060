"""The database fixtures: each db_url is a real, empty, isolated database of the backend its id names."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests import databases


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url)


def test_db_url_is_a_working_empty_database(db_url: str, request: pytest.FixtureRequest) -> None:
    backend = request.node.callspec.params["db_url"]
    engine = _engine(db_url)
    try:
        assert engine.dialect.name == backend
        assert sa.inspect(engine).get_table_names() == []
        meta = sa.MetaData()
        items = sa.Table(
            "items",
            meta,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("name", sa.String(50), nullable=False),
        )
        meta.create_all(engine)
        with engine.begin() as conn:
            conn.execute(items.insert(), [{"name": "h100"}, {"name": "h20"}])
        with engine.connect() as conn:
            assert conn.execute(sa.select(items.c.name).order_by(items.c.id)).scalars().all() == ["h100", "h20"]
            if backend == "postgresql":
                assert "PostgreSQL" in conn.execute(sa.text("SELECT version()")).scalar_one()
                assert conn.execute(sa.text("SELECT current_database()")).scalar_one().startswith(databases.DB_PREFIX)
    finally:
        engine.dispose()


def test_databases_are_isolated(db_url: str, tmp_path, request: pytest.FixtureRequest) -> None:
    backend = request.node.callspec.params["db_url"]
    if backend == "sqlite":
        other_url = f"sqlite+pysqlite:///{tmp_path}/other.db"
    else:
        other_url = databases.new_database(request.getfixturevalue("postgres_admin_url"))
    first, second = _engine(db_url), _engine(other_url)
    try:
        with first.begin() as conn:
            conn.execute(sa.text("CREATE TABLE only_here (id INTEGER PRIMARY KEY)"))
        assert sa.inspect(first).has_table("only_here")
        assert not sa.inspect(second).has_table("only_here")
        assert sa.inspect(second).get_table_names() == []
    finally:
        first.dispose()
        second.dispose()
        if backend == "postgresql":
            databases.drop_database(request.getfixturevalue("postgres_admin_url"), other_url)
