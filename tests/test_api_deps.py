"""Short reads from async routes: no thread hop on SQLite, and on PostgreSQL no blocked event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from sqlalchemy import literal, select, text

# Checks of a database across a network: PostgreSQL only (SQLite reads are local calls, and it has no server).
ONLY_POSTGRES = pytest.mark.parametrize(
    "db_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)


def test_a_short_read_runs_inline_only_on_an_embedded_database(db: Any) -> None:
    def read(c: Any) -> tuple[int, int]:
        return threading.get_ident(), c.execute(text("SELECT 40 + 2")).scalar_one()

    async def main() -> tuple[int, tuple[int, int]]:
        return threading.get_ident(), await db.short_read(read)

    loop_thread, (body_thread, answer) = asyncio.run(main())
    assert answer == 42
    assert (body_thread == loop_thread) == (db.dialect == "sqlite")


def test_short_reads_work_from_a_second_event_loop(db: Any) -> None:
    for _ in range(2):
        assert asyncio.run(db.short_read(lambda c: c.execute(text("SELECT 1")).scalar_one())) == 1


@ONLY_POSTGRES
def test_short_reads_on_a_network_database_leave_the_loop_free(db: Any) -> None:
    """While PostgreSQL works on one read the loop serves others: five 0.3 s reads end together, not in turn."""

    async def main() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(db.short_read(lambda c: c.execute(text("SELECT pg_sleep(0.3)"))) for _ in range(5)))
        return time.perf_counter() - t0

    assert asyncio.run(main()) < 1.2  # in turn: >= 1.5 s


def test_read_one_returns_the_row_on_both_databases(db: Any) -> None:
    """The hottest reads skip SQLAlchemy's result layer on PostgreSQL: the row must still be the same values."""
    from decimal import Decimal

    from sqlalchemy import bindparam, literal, select

    statement = select(bindparam("a") + 1, literal(Decimal("1.50000000")), bindparam("b"))

    async def main() -> tuple[Any, ...]:
        try:
            first = await db.read_one(statement, {"a": 41, "b": "x"})
            assert await db.read_one(statement, {"a": 1, "b": None}) == (2, Decimal("1.5"), None)
            return first
        finally:
            await db.aclose()

    assert asyncio.run(main()) == (42, Decimal("1.5"), "x")


@ONLY_POSTGRES
def test_read_one_survives_the_server_closing_its_connections(db: Any) -> None:
    """Kept connections that PostgreSQL closed (a restart) cost one retry on a new one, not a failed request."""
    one = SELECT_ONE

    async def main() -> None:
        try:
            assert await asyncio.gather(*(db.read_one(one, {}) for _ in range(3))) == [(1,)] * 3  # 3 kept
            with db.engine.connect() as c:  # end every other backend of this database, as a restart would
                c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = current_database() AND pid <> pg_backend_pid()"))  # fmt: skip
            assert await db.read_one(one, {}) == (1,)
        finally:
            await db.aclose()

    asyncio.run(main())


SELECT_ONE = select(literal(1))


@ONLY_POSTGRES
def test_a_read_that_hangs_fails_in_its_time_and_frees_its_connection(db: Any) -> None:
    """A read that does not answer in time raises `DatabaseUnavailable` (503 for the caller) instead of holding the
    request and its slot until TCP gives up; its connection is closed, and the next read works."""
    from sqlalchemy import func

    from suanli.db.engine import DatabaseUnavailable

    async def main() -> float:
        try:
            pool = await db._async_pool()
            pool.timeout_s = 0.3
            t0 = time.perf_counter()
            with pytest.raises(DatabaseUnavailable, match=r"no answer within 0\.3 s"):
                await db.read_one(select(func.pg_sleep(5)), {})
            took = time.perf_counter() - t0
            assert pool.idle == []  # the connection that timed out was not kept
            assert await db.read_one(SELECT_ONE, {}) == (1,)
            return took
        finally:
            await db.aclose()

    assert asyncio.run(main()) < 2.0  # not the 5 s the statement asked for


@ONLY_POSTGRES
def test_requests_get_503_while_the_database_refuses_connections_and_work_again_after(
    api: Any, db_url: str, request: pytest.FixtureRequest
) -> None:
    """A database restarting (here: refusing new connections, every open one ended) is a 503 with Retry-After for
    the async balance read and for a sync route alike, not a 500; once it is back, the same requests succeed."""
    import psycopg
    from sqlalchemy.engine import make_url

    from tests.control_plane import signup
    from tests.databases import _libpq_url

    tenant = signup(api, "restart@example.com")
    paths = [f"/api/v1/orgs/{tenant.org_id}/balance", "/api/v1/workloads"]
    assert [api.get(p, headers=tenant.headers).status_code for p in paths] == [200, 200]
    name = make_url(db_url).database
    with psycopg.connect(_libpq_url(request.getfixturevalue("postgres_admin_url")), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            for p in paths:
                r = api.get(p, headers=tenant.headers)
                assert (r.status_code, r.headers.get("retry-after")) == (503, "1"), (p, r.text)
                assert r.json()["detail"] == "the database is unavailable right now; try again"
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert [api.get(p, headers=tenant.headers).status_code for p in paths] == [200, 200]


def test_only_errors_that_say_the_database_is_unavailable_count_as_transient(tmp_path: Any) -> None:
    """503-and-retry is for a database that cannot serve right now (busy, locked, unreachable); a missing table
    or another fault of the code or the install is not, and must surface as a 500."""
    import sqlite3

    import sqlalchemy.exc
    from sqlalchemy import create_engine

    from suanli.db.engine import DatabaseUnavailable, transient

    path = tmp_path / "t.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")  # holds the write lock
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    try:
        with engine.connect() as c, pytest.raises(sqlalchemy.exc.OperationalError) as busy:
            c.exec_driver_sql("INSERT INTO t VALUES (1)")
        with engine.connect() as c, pytest.raises(sqlalchemy.exc.OperationalError) as missing:
            c.exec_driver_sql("SELECT * FROM nope")
    finally:
        holder.execute("ROLLBACK")
        engine.dispose()
    refused = create_engine("postgresql+psycopg://u:p@127.0.0.1:1/x", connect_args={"connect_timeout": 2})
    with pytest.raises(sqlalchemy.exc.OperationalError) as unreachable:
        refused.connect()
    assert transient(busy.value) and transient(unreachable.value) and transient(DatabaseUnavailable("x"))
    assert not transient(missing.value) and not transient(ValueError("x"))


def test_a_fault_that_is_not_unavailability_stays_a_500(api: Any, db_url: str) -> None:
    import sqlalchemy.exc
    from sqlalchemy import create_engine

    from tests.control_plane import signup

    tenant = signup(api, "broken@example.com")
    engine = create_engine(db_url)
    try:
        with engine.begin() as c:
            c.execute(text("ALTER TABLE workloads RENAME TO workloads_gone"))
        with pytest.raises(sqlalchemy.exc.DBAPIError):  # the test client re-raises what a server answers 500 to
            api.get("/api/v1/workloads", headers=tenant.headers)
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("sqlstate", "transient"),
    [(None, True), ("08006", True), ("57P01", True), ("53300", True), ("40P01", True), ("40001", True),
     ("55P03", True), ("54000", False), ("42P01", False), ("55000", False), ("", False)],
)  # fmt: skip
def test_postgresql_errors_that_mean_not_now(sqlstate: str | None, transient: bool) -> None:
    """Connection trouble, shutdown, too many connections, a rolled-back deadlock or serialization failure and a
    lock not had are worth a retry; a statement too big or a missing table is not."""
    from suanli.db.engine import _transient_sqlstate

    assert _transient_sqlstate(sqlstate) is transient
