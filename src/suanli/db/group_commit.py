"""Group commit: many small writes from many request threads, committed together.

A submission is two inserts; on its own transaction it pays for BEGIN, COMMIT and, on SQLite, for holding the
database's only write lock while its thread waits for the GIL between statements. Here request threads hand
their items to one writer thread, which writes everything queued so far in one transaction (`write_many`) and
then wakes each caller with its own outcome. Under load a transaction carries tens of items; alone, an item
is written at once.

A batch that fails on an item's own data (a key or a value the database refuses) is retried item by item, so
one bad item fails only its own caller; any other failure (the database unreachable, a lock not granted)
fails the whole batch with that error, at once, rather than retrying each item into the same wall.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session

from suanli.db.engine import Database

T = TypeVar("T")

WriteMany = Callable[[Session, Sequence[T]], None]
Settle = Callable[[BaseException | None], None]  # tells one caller its item's outcome (None: committed)
ITEM_ERRORS = (IntegrityError, DataError)  # what one item's data can cause: worth retrying the others alone
WRITE_TIMEOUT_S = 120.0  # a caller never waits longer than this for its commit

log = logging.getLogger("suanli.db")


class Closed(RuntimeError):
    """The group commit was closed (the server is shutting down)."""


class GroupCommit(Generic[T]):
    """Write items in shared transactions; `write` returns once the caller's item is committed."""

    def __init__(self, db: Database, write_many: WriteMany[T], *, max_batch: int = 256, name: str = "writer") -> None:
        self.db, self.write_many, self.max_batch, self.name = db, write_many, max_batch, name
        self._queue: queue.SimpleQueue[tuple[T, Settle] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _thread and _closed
        self._closed = False
        self.batches = 0  # transactions committed (for tests and figures)

    def write(self, item: T, timeout: float | None = WRITE_TIMEOUT_S) -> None:
        """Commit `item` (raising what writing it raised, if it failed)."""
        done: Future[None] = Future()

        def settle(error: BaseException | None) -> None:
            if done.done():  # settled already (a writer failing half-way through settling its batch)
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        self._put(item, settle)
        done.result(timeout)

    async def write_async(self, item: T, timeout: float | None = WRITE_TIMEOUT_S) -> None:
        """`write` for a coroutine: the event loop is woken when the item's transaction ends (once for all the
        items of a batch it waits on), and no thread is held meanwhile."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def resolve(error: BaseException | None) -> None:
            if done.done():  # the caller gave up (cancelled): its item was written all the same
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        self._put(item, lambda error: loop.call_soon_threadsafe(resolve, error))
        await asyncio.wait_for(done, timeout)

    def _put(self, item: T, settle: Settle) -> None:
        with self._lock:
            if self._closed:
                raise Closed(f"{self.name}: closed")
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"group-commit-{self.name}", daemon=True)
                self._thread.start()
            self._queue.put((item, settle))

    def close(self, timeout: float = 60.0) -> None:
        """Finish what is queued and stop the writer thread; later writes raise `Closed`."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        batch: list[tuple[T, Settle]] = []
        try:
            while True:
                first = self._queue.get()
                if first is None:
                    return
                batch = [first]
                stop = False
                while len(batch) < self.max_batch:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    batch.append(nxt)
                self._commit(batch)
                batch = []
                if stop:
                    return
        except BaseException as e:  # never leave a caller waiting on a writer that is gone
            log.exception("%s: writer thread failed", self.name)
            for _, settle in batch:
                settle(e)
            raise
        finally:
            self._fail_queued()

    def _fail_queued(self) -> None:
        """Items queued after the end (a write racing `close`) get an error instead of silence."""
        while True:
            try:
                left = self._queue.get_nowait()
            except queue.Empty:
                return
            if left is not None:
                left[1](Closed(f"{self.name}: closed before this item was written"))

    def _commit(self, batch: list[tuple[T, Settle]]) -> None:
        try:
            self._transaction([item for item, _ in batch])
        except ITEM_ERRORS as e:
            if len(batch) == 1:
                batch[0][1](e)
                return
            for item, settle in batch:  # each alone: only the bad ones fail
                try:
                    self._transaction([item])
                except Exception as e1:
                    settle(e1)
                else:
                    settle(None)
            return
        except Exception as e:
            for _, settle in batch:
                settle(e)
            return
        for _, settle in batch:
            settle(None)

    def _transaction(self, items: list[T]) -> None:
        with self.db.write() as s, s.begin():
            self.write_many(s, items)
        self.batches += 1
