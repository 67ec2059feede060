"""Group commit: many small writes from many request threads, committed together.

A submission is two inserts; on its own transaction it pays for BEGIN, COMMIT and, on SQLite, for holding the
database's only write lock while its thread waits for the GIL between statements. Here request threads hand
their items to one writer thread, which writes everything queued so far in one transaction (`write_many`) and
then wakes each caller with its own outcome. Under load a transaction carries tens of items; alone, an item
is written at once.

With a `prepare` step, each item is first turned into what is written (a submission's checks, for example)
by the writer thread in one read session for the batch, before its transaction opens: a caller whose item
is refused there gets that error, the rest are written. The caller then hands its item over once, rather than
running its checks in a thread of its own and handing the result over again.

A batch that fails on an item's own data (a key or a value the database refuses) is retried item by item, so
one bad item fails only its own caller; any other database failure (the database unreachable, a lock not
granted), in the prepare step or the write, fails the whole batch with that error at once, rather than trying
each item into the same wall. An item whose caller stopped waiting (timed out, cancelled) is dropped
unwritten if the writer has not reached it yet: a caller told of a failure must not find its item written.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from suanli.db.engine import Database

Item = TypeVar("Item")  # what callers hand in
T = TypeVar("T")  # what is written (the item itself, without a prepare step)

WriteMany = Callable[[Session, Sequence[T]], None]
Prepare = Callable[[Session, Item], T]
Settle = Callable[[BaseException | None, T | None], None]  # one caller's outcome: an error, or what was written
ITEM_ERRORS = (IntegrityError, DataError)  # what one item's data can cause: worth retrying the others alone
WRITE_TIMEOUT_S = 120.0  # a caller never waits longer than this for its commit

log = logging.getLogger("suanli.db")


class Closed(RuntimeError):
    """The group commit was closed (the server is shutting down)."""


def _same(s: Session, item: Any) -> Any:
    return item


@dataclass(frozen=True, slots=True)
class _Waiter(Generic[Item, T]):
    item: Item
    settle: Settle[T]
    gone: Callable[[], bool]  # the caller stopped waiting

    def tell(self, error: BaseException | None, written: T | None = None) -> None:
        try:
            self.settle(error, written)
        except Exception:  # (its event loop closed): the other callers of the batch must still be told
            log.exception("telling a caller its outcome failed")


class GroupCommit(Generic[Item, T]):
    """Write items in shared transactions; `write` returns what was written once it is committed."""

    def __init__(
        self,
        db: Database,
        write_many: WriteMany[T],
        *,
        prepare: Prepare[Item, T] = _same,
        max_batch: int = 256,
        name: str = "writer",
    ) -> None:
        self.db, self.write_many, self.prepare, self.max_batch, self.name = db, write_many, prepare, max_batch, name
        self._queue: queue.SimpleQueue[_Waiter[Item, T] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _thread and _closed
        self._closed = False
        self.batches = 0  # transactions committed (for tests and figures)

    def write(self, item: Item, timeout: float | None = WRITE_TIMEOUT_S) -> T:
        """Commit `item`; what was written (raising what preparing or writing it raised, if it failed)."""
        done: Future[T] = Future()

        def settle(error: BaseException | None, written: T | None) -> None:
            if done.done():  # settled already, or the caller gave up
                return
            if error is None:
                done.set_result(written)  # type: ignore[arg-type]
            else:
                done.set_exception(error)

        self._put(_Waiter(item, settle, done.done))
        try:
            return done.result(timeout)
        except TimeoutError:
            if not done.cancel():  # answered in the meantime: that answer stands
                return done.result()
            raise  # and it is not written if the writer has not reached it yet

    async def write_async(self, item: Item, timeout: float | None = WRITE_TIMEOUT_S) -> T:
        """`write` for a coroutine: the event loop is woken when the item's transaction ends (once for all the
        items of a batch it waits on), and no thread is held meanwhile."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def resolve(error: BaseException | None, written: T | None) -> None:
            if done.done():  # the caller gave up (timed out, cancelled)
                return
            if error is None:
                done.set_result(written)  # type: ignore[arg-type]
            else:
                done.set_exception(error)

        self._put(_Waiter(item, lambda error, written: loop.call_soon_threadsafe(resolve, error, written), done.done))
        return await asyncio.wait_for(done, timeout)

    def _put(self, waiter: _Waiter[Item, T]) -> None:
        with self._lock:
            if self._closed:
                raise Closed(f"{self.name}: closed")
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"group-commit-{self.name}", daemon=True)
                self._thread.start()
            self._queue.put(waiter)

    def close(self, timeout: float = 60.0) -> None:
        """Finish what is queued and stop the writer thread; later writes raise `Closed`."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        batch: list[_Waiter[Item, T]] = []
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
            for waiter in batch:
                waiter.tell(e)
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
                left.tell(Closed(f"{self.name}: closed before this item was written"))

    def _prepared(self, batch: list[_Waiter[Item, T]]) -> list[tuple[T, _Waiter[Item, T]]]:
        """What to write for each item still waited for; an item its step refuses is told so here, and a
        database error fails the whole batch at once (after one more try on a fresh connection, if the one it
        failed on was dead)."""
        waiting = [w for w in batch if not w.gone()]
        if self.prepare is _same:
            return [(w.item, w) for w in waiting]  # type: ignore[misc]
        out: list[tuple[T, _Waiter[Item, T]]] = []
        i, retried = 0, False
        while i < len(waiting):
            try:
                with self.db.read() as s:
                    for waiter in waiting[i:]:
                        try:
                            out.append((self.prepare(s, waiter.item), waiter))
                        except ITEM_ERRORS as e:
                            waiter.tell(e)
                        except DBAPIError:
                            raise
                        except Exception as e:  # the item refused (a 4xx), or a bug that concerns it alone
                            waiter.tell(e)
                        i += 1
            except DBAPIError as e:  # the checks are fixed statements: the database, not the item, failed
                if e.connection_invalidated and not retried:  # a stale pooled connection (the server restarted)
                    retried = True  # the rest once more, on a fresh one
                    continue
                for _, done in out:
                    done.tell(e)
                for rest in waiting[i:]:
                    rest.tell(e)
                return []
        return out

    def _commit(self, queued: list[_Waiter[Item, T]]) -> None:
        try:
            prepared = self._prepared(queued)
        except Exception as e:  # the read session itself failed
            for waiter in queued:
                waiter.tell(e)
            return
        batch = [(row, w) for row, w in prepared if not w.gone()]
        if not batch:
            return
        try:
            self._transaction([row for row, _ in batch])
        except ITEM_ERRORS as e:
            if len(batch) == 1:
                batch[0][1].tell(e)
                return
            for row, waiter in batch:  # each alone: only the bad ones fail
                if waiter.gone():
                    continue
                try:
                    self._transaction([row])
                except Exception as e1:
                    waiter.tell(e1)
                else:
                    waiter.tell(None, row)
            return
        except Exception as e:
            for _, waiter in batch:
                waiter.tell(e)
            return
        for row, waiter in batch:
            waiter.tell(None, row)

    def _transaction(self, items: list[T]) -> None:
        with self.db.write() as s, s.begin():
            self.write_many(s, items)
        self.batches += 1
