"""The database fixtures: each db_url is a real, isolated database of the backend its id names, at head; each
empty_db_url the same, empty."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import sqlalchemy as sa

from tests import databases


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url)


def test_empty_db_url_is_a_working_empty_database(empty_db_url: str, request: pytest.FixtureRequest) -> None:
    backend = request.node.callspec.params["empty_db_url"]
    engine = _engine(empty_db_url)
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


def test_db_url_is_a_fresh_copy_at_head_that_writes_stay_in(db_url: str, request: pytest.FixtureRequest) -> None:
    """Each test's copy of the session's migrated database is at the migrations' head with no rows, and what one
    test writes stays in its copy (the next test's copy is fresh: `test_databases_are_isolated`)."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from suanli.db.engine import Database
    from suanli.db.migrate import alembic_config

    backend = request.node.callspec.params["db_url"]
    db = Database(db_url)
    try:
        head = ScriptDirectory.from_config(alembic_config(db.engine)).get_current_head()
        with db.engine.connect() as conn:
            assert conn.dialect.name == backend
            assert MigrationContext.configure(conn).get_current_revision() == head
            assert conn.execute(sa.text("SELECT count(*) FROM users")).scalar_one() == 0
        with db.engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE mine_only (id INTEGER PRIMARY KEY)"))
    finally:
        db.dispose()
    if backend == "sqlite":
        source_url = f"sqlite+pysqlite:///{request.getfixturevalue('migrated_sqlite')}"
    else:
        admin_url = request.getfixturevalue("postgres_admin_url")
        source_url = sa.make_url(admin_url).set(database=databases.migrated_template(admin_url)).render_as_string(False)
    source = _engine(source_url)
    try:
        assert "users" in sa.inspect(source).get_table_names()
        assert not sa.inspect(source).has_table("mine_only")
    finally:
        source.dispose()  # a template must have no connections open


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


def test_a_postgresql_server_that_never_answers_fails_a_connection_in_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that accepts the TCP connection and then says nothing (a hung host, a half-open proxy) must not
    hold a request, or the submission writer, for the OS's TCP timeout: `connect_timeout` bounds it."""
    import socket
    import threading
    import time

    from suanli.db import engine as engine_module

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed at the end of the test
            for _ in range(8):
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setattr(engine_module, "CONNECT_TIMEOUT_S", 2)
    db = engine_module.Database(f"postgresql+psycopg://u:p@127.0.0.1:{listener.getsockname()[1]}/x")

    def connect(session: Any, out: list[BaseException]) -> None:
        try:
            with session() as s:
                s.execute(sa.text("SELECT 1"))
        except BaseException as e:
            out.append(e)

    try:
        for session in (db.read, db.write):
            t0, errors = time.monotonic(), []
            attempt = threading.Thread(target=connect, args=(session, errors), daemon=True)
            attempt.start()
            attempt.join(15)
            assert not attempt.is_alive(), "still connecting: no connect_timeout"
            assert errors and isinstance(errors[0], sa.exc.OperationalError), errors
            assert time.monotonic() - t0 < 10
    finally:
        db.dispose()
        for conn in held:
            conn.close()
        listener.close()
