"""Reused psycopg asyncio connections for the hottest reads of async routes (see `Database.read_one`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class AsyncReads:
    """psycopg asyncio connections (autocommit) of one event loop, reused, at most `size` at once. No background
    tasks, so nothing outlives the requests that use it. A connection that failed is closed, not reused; one idle
    for longer than `recycle_s` is replaced, as the sync pools recycle theirs. A read that takes longer than
    `timeout_s` (waiting for a slot included) is cancelled, raises TimeoutError and closes its connection: a hung
    database or network fails the request in seconds instead of holding it, and its slot, until TCP gives up.
    (psycopg first asks the server to cancel the query, which against a hung network takes up to ~10 s more.)"""

    def __init__(self, params: dict[str, Any], size: int, recycle_s: float = 1800.0, timeout_s: float = 10.0) -> None:
        self.params, self.recycle_s, self.timeout_s = params, recycle_s, timeout_s
        self.slots = asyncio.Semaphore(size)
        self.idle: list[tuple[Any, float]] = []  # (connection, when it was last given back)
        self.closed = False

    async def fetch_one(self, sql: str, params: dict[str, Any]) -> Any:
        async with asyncio.timeout(self.timeout_s):
            return await self._fetch_one(sql, params)

    async def _fetch_one(self, sql: str, params: dict[str, Any]) -> Any:
        import psycopg

        async with self.slots:
            conn, reused = await self._checkout()
            try:
                row = await (await conn.execute(sql, params)).fetchone()
            except psycopg.OperationalError:
                stale = reused and conn.broken  # the server closed it while idle (a restart): likely all of them
                await conn.close()
                if not stale:
                    raise
                await self._drop_idle()
                conn = await self._connect()
                try:
                    row = await (await conn.execute(sql, params)).fetchone()
                except BaseException:
                    await conn.close()
                    raise
            except BaseException:
                await conn.close()
                raise
            await self._give_back(conn)
            return row

    async def _checkout(self) -> tuple[Any, bool]:
        now = time.monotonic()
        while self.idle:
            conn, since = self.idle.pop()
            if now - since < self.recycle_s and not conn.closed:
                return conn, True
            await conn.close()
        return await self._connect(), False

    async def _connect(self) -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(**self.params, autocommit=True)

    async def _give_back(self, conn: Any) -> None:
        if self.closed or conn.closed:
            await conn.close()
        else:
            self.idle.append((conn, time.monotonic()))

    async def _drop_idle(self) -> None:
        idle, self.idle = self.idle, []
        for conn, _ in idle:
            await conn.close()

    async def close(self) -> None:
        self.closed = True  # connections in use now are closed when given back
        await self._drop_idle()
