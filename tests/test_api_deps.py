"""Short reads from async routes: no thread hop on SQLite, and on PostgreSQL no blocked event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from sqlalchemy import literal, select, text


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


def test_short_reads_on_a_network_database_leave_the_loop_free(db: Any) -> None:
    """While PostgreSQL works on one read the loop serves others: five 0.3 s reads end together, not in turn."""
    if db.embedded:
        pytest.skip("SQLite reads are local calls and run inline, one after another")

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


def test_read_one_survives_the_server_closing_its_connections(db: Any) -> None:
    """Kept connections that PostgreSQL closed (a restart) cost one retry on a new one, not a failed request."""
    if db.embedded:
        pytest.skip("SQLite has no server to close connections")
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
