"""Password hashing off the event loop and off the request threads: argon2 costs ~0.3 s of CPU per hash by
design, so checks run on a few threads of their own behind a bounded queue. A flood of logins then waits for (or
is refused by) this pool, while every other request keeps the shared threads: nobody's `GET /me` queues behind
16 clients guessing passwords."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from suanli.control.errors import Unavailable

T = TypeVar("T")


class Slot:
    """A place in the pool's queue, taken before a request does anything else (so a refusal costs nothing): run
    one hash in it, or release it."""

    def __init__(self, pool: PasswordPool) -> None:
        self._pool, self._held = pool, True

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        if not self._held:
            raise RuntimeError("a slot runs one hash")
        future = self._pool._executor.submit(fn, *args)
        self._held = False
        # The slot is freed when the hash is done, not when the caller stops waiting: a client that hangs up
        # must not let more work queue than the bound.
        future.add_done_callback(lambda _: self._pool._slots.release())
        return await asyncio.wrap_future(future)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._pool._slots.release()


class PasswordPool:
    """`threads` hashing at once and at most `queue` more waiting; past that a request gets 503 at once."""

    def __init__(self, threads: int = 2, queue: int = 32) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="passwords")
        self._slots = threading.Semaphore(threads + queue)

    def reserve(self) -> Slot:
        if not self._slots.acquire(blocking=False):
            raise Unavailable("too many password checks at once; try again", retry_after=1)
        return Slot(self)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        return await self.reserve().run(fn, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
