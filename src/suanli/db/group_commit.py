"""Group commit: many small writes from many request threads, committed together.

A submission is two inserts; on its own transaction it pays for BEGIN, COMMIT and, on SQLite, for holding the
database's only write lock while its thread waits for the GIL between statements. Here request threads hand
their items to one writer thread, which writes everything queued so far in one transaction (`write_many`) and
then wakes each caller with its own outcome. Under load a transaction carries tens of items; alone, an item
is written at once. If a batch fails, each of its items is retried in a transaction of its own, so one bad
item fails only its own caller.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from sqlalchemy.orm import Session

from suanli.db.engine import Database

T = TypeVar("T")

WriteMany = Callable[[Session, Sequence[T]], None]


class GroupCommit(Generic[T]):
    """Write items in shared transactions; `write` returns once the caller's item is committed."""

    def __init__(self, db: Database, write_many: WriteMany[T], *, max_batch: int = 256, name: str = "writer") -> None:
        self.db, self.write_many, self.max_batch, self.name = db, write_many, max_batch, name
        self._queue: queue.SimpleQueue[tuple[T, Future[None]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self.batches = 0  # transactions committed (for tests and figures)

    def write(self, item: T, timeout: float | None = None) -> None:
        """Commit `item` (raising what writing it alone raised, if it failed)."""
        self._ensure_thread()
        done: Future[None] = Future()
        self._queue.put((item, done))
        done.result(timeout)

    def close(self) -> None:
        """Finish what is queued and stop the writer thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _ensure_thread(self) -> None:
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    t = threading.Thread(target=self._run, name=f"group-commit-{self.name}", daemon=True)
                    t.start()
                    self._thread = t

    def _run(self) -> None:
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
            if stop:
                return

    def _commit(self, batch: list[tuple[T, Future[None]]]) -> None:
        try:
            self._transaction([item for item, _ in batch])
        except Exception as e:
            if len(batch) == 1:
                batch[0][1].set_exception(e)  # the caller's thread raises it
                return
            for item, done in batch:  # each alone: only the bad ones fail
                try:
                    self._transaction([item])
                except Exception as e1:
                    done.set_exception(e1)
                else:
                    done.set_result(None)
            return
        for _, done in batch:
            done.set_result(None)

    def _transaction(self, items: list[T]) -> None:
        with self.db.write() as s, s.begin():
            self.write_many(s, items)
        self.batches += 1
