"""Short reads from async routes: no thread hop on SQLite, and on PostgreSQL no blocked event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text


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
