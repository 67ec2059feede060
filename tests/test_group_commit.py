"""Group commit and SQLite's write lock, on real databases.

`GroupCommit` must commit every item once, share transactions under concurrency, and fail only the bad items of a
failed batch. The SQLite writer queue (`db.engine`) must hand the write lock over and never leak it: not after a
commit, a rollback, an exception inside the transaction, nor when another process holds the lock for a while.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from suanli.db.engine import Database
from suanli.db.group_commit import Closed, GroupCommit

META = sa.MetaData()
ITEMS = sa.Table(
    "items",
    META,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(50), nullable=False),
)


@pytest.fixture
def plain_db(db_url: str) -> Any:
    database = Database(db_url)
    META.create_all(database.engine)
    yield database
    database.dispose()


def _insert_many(s: Session, items: Sequence[dict[str, Any]]) -> None:
    s.execute(ITEMS.insert(), list(items))


def _names(db: Database) -> list[str]:
    with db.read() as s:
        return list(s.scalars(sa.select(ITEMS.c.name).order_by(ITEMS.c.id)))


def test_every_item_is_committed_once_and_concurrent_items_share_transactions(plain_db: Database) -> None:
    gc: GroupCommit[dict[str, Any], dict[str, Any]] = GroupCommit(plain_db, _insert_many, name="test")
    n_threads, per_thread = 8, 40
    start = threading.Barrier(n_threads)

    def writer(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            gc.write({"id": t * 1000 + i, "name": f"{t}-{i}"}, timeout=60)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    gc.close()
    names = _names(plain_db)
    assert sorted(names) == sorted(f"{t}-{i}" for t in range(n_threads) for i in range(per_thread))
    # Eight writers at once: a transaction carries more than one item (each writer waits for its own commit, so
    # at most eight can be queued together).
    assert gc.batches < n_threads * per_thread


def test_a_bad_item_fails_only_its_own_caller(plain_db: Database) -> None:
    gc: GroupCommit[dict[str, Any], dict[str, Any]] = GroupCommit(plain_db, _insert_many, name="test")
    gc.write({"id": 1, "name": "first"})
    results: dict[int, BaseException | None] = {}
    start = threading.Barrier(6)

    def writer(item_id: int) -> None:
        start.wait()
        try:
            gc.write({"id": item_id, "name": f"n{item_id}"}, timeout=60)  # id 1 exists: a key violation
            results[item_id] = None
        except Exception as e:
            results[item_id] = e

    threads = [threading.Thread(target=writer, args=(i,)) for i in (1, 2, 3, 4, 5, 6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    gc.close()
    assert isinstance(results[1], sa.exc.IntegrityError)
    assert all(results[i] is None for i in (2, 3, 4, 5, 6))
    assert sorted(_names(plain_db)) == ["first", "n2", "n3", "n4", "n5", "n6"]


def test_close_finishes_what_is_queued_and_refuses_later_writes(plain_db: Database) -> None:
    gc: GroupCommit[dict[str, Any], dict[str, Any]] = GroupCommit(plain_db, _insert_many, name="test")
    gc.write({"id": 1, "name": "a"})
    gc.close()
    with pytest.raises(Closed):
        gc.write({"id": 2, "name": "b"})
    assert _names(plain_db) == ["a"]


def test_a_failure_not_of_an_items_data_fails_the_batch_at_once(plain_db: Database) -> None:
    """The database refusing the transaction itself is not retried item by item: every caller gets the error."""
    calls: list[int] = []
    gate = threading.Event()

    def broken(s: Session, items: Sequence[dict[str, Any]]) -> None:
        calls.append(len(items))
        gate.wait(5)  # the first call holds the writer while the others queue up behind it
        raise RuntimeError("database unreachable")

    gc: GroupCommit[dict[str, Any], dict[str, Any]] = GroupCommit(plain_db, broken, name="test")
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            gc.write({"id": i, "name": str(i)}, timeout=30)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(5)]
    threads[0].start()
    while not calls:
        time.sleep(0.01)
    for th in threads[1:]:
        th.start()
    time.sleep(0.3)
    gate.set()
    for th in threads:
        th.join()
    gc.close()
    assert len(errors) == 5 and all(isinstance(e, RuntimeError) for e in errors)
    assert calls == [1, 4]  # one transaction for the first, one for the four queued behind it: no retries


def _write_in_thread(db: Database, name: str, timeout: float = 20.0) -> bool:
    done = threading.Event()

    def work() -> None:
        with db.write() as s, s.begin():
            s.execute(ITEMS.insert(), {"name": name})
        done.set()

    threading.Thread(target=work, daemon=True).start()
    return done.wait(timeout)


def test_sqlite_write_lock_is_released_after_commit_rollback_and_errors(tmp_path: Any) -> None:
    db = Database(f"sqlite+pysqlite:///{tmp_path}/w.db")
    META.create_all(db.engine)
    try:
        with db.write() as s, s.begin():
            s.execute(ITEMS.insert(), {"name": "committed"})
        with db.write() as s:
            s.execute(ITEMS.insert(), {"name": "rolled back"})
            s.rollback()
        with pytest.raises(RuntimeError), db.write() as s, s.begin():
            s.execute(ITEMS.insert(), {"name": "raised"})
            raise RuntimeError("boom")
        with db.write() as s:  # closed without commit or rollback: the pool's return gives the lock back
            s.execute(ITEMS.insert(), {"name": "abandoned"})
        # Each of those let go of the write lock: another thread of this process writes at once.
        assert _write_in_thread(db, "after")
        assert _names(db) == ["committed", "after"]
    finally:
        db.dispose()


def _hold_write_lock(path: Any, statement: str) -> subprocess.Popen[str]:
    """Another process that takes the write lock on `path` (BEGIN IMMEDIATE), runs `statement`, holds it for a
    second and commits; returned once it holds the lock."""
    code = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); c.execute(sys.argv[2]); print('held', flush=True)\n"
        "time.sleep(1.0); c.execute('COMMIT')\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(path), statement], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_sqlite_writer_waits_for_another_process_and_then_writes(tmp_path: Any) -> None:
    """Another process holds the write lock for a second; a writer here waits (no 'database is locked'),
    then writes as soon as the lock is free."""
    path = tmp_path / "w.db"
    db = Database(f"sqlite+pysqlite:///{path}")
    META.create_all(db.engine)
    holder = _hold_write_lock(path, "INSERT INTO items (name) VALUES ('other')")
    try:
        t0 = time.monotonic()
        with db.write() as s, s.begin():
            s.execute(ITEMS.insert(), {"name": "mine"})  # BEGIN IMMEDIATE goes with the first statement
            waited = time.monotonic() - t0
        assert holder.wait(30) == 0
        assert waited > 0.5  # it did wait for the other process's transaction
        assert _names(db) == ["other", "mine"]
    finally:
        holder.kill()
        db.dispose()


def test_a_new_file_turns_to_wal_while_another_process_holds_its_write_lock(tmp_path: Any) -> None:
    """A new file is in rollback-journal mode until the first connection turns it to WAL, and SQLite answers that
    pragma "database is locked" at once, without waiting, while another connection holds the reserved lock:
    processes starting together on a new file (`suanli server --workers N`) failed that way. The first
    connection waits for the lock instead, and the file ends in WAL."""
    path = tmp_path / "new.db"
    holder = _hold_write_lock(path, "CREATE TABLE early (x)")
    db = Database(f"sqlite+pysqlite:///{path}")
    try:
        t0 = time.monotonic()
        with db.engine.connect() as conn:
            waited = time.monotonic() - t0
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("SELECT count(*) FROM early").scalar() == 0
        assert holder.wait(30) == 0
        assert waited > 0.5  # it waited for the other process's transaction
    finally:
        holder.kill()
        db.dispose()


def test_coroutines_wait_without_threads_and_share_transactions(plain_db: Database) -> None:
    import asyncio

    gc: GroupCommit[dict[str, Any], dict[str, Any]] = GroupCommit(plain_db, _insert_many, name="test")

    async def main(items: list[dict[str, Any]]) -> list[BaseException | None]:
        results = await asyncio.gather(*(gc.write_async(x, timeout=60) for x in items), return_exceptions=True)
        return list(results)

    items = [{"id": i, "name": f"a{i}"} for i in range(50)]
    assert asyncio.run(main(items)) == items  # each caller gets what was written for it
    assert gc.batches < 50  # written together, not one transaction each
    (again,) = asyncio.run(main([{"id": 7, "name": "again"}]))  # a key violation: its caller gets the error
    gc.close()
    assert isinstance(again, sa.exc.IntegrityError)
    assert sorted(_names(plain_db)) == sorted(f"a{i}" for i in range(50))


def test_a_prepare_step_refuses_items_alone_and_hands_back_what_was_written(plain_db: Database) -> None:
    """The writer thread prepares each item (in one read session for the batch) before the batch's transaction:
    an item it refuses fails only its own caller, and each caller gets its own prepared row back."""
    seen_rows: list[int] = []

    def prepare(s: Session, item: int) -> dict[str, Any]:
        seen_rows.append(len(s.execute(sa.select(ITEMS.c.id)).all()))  # a read session works here
        if item % 3 == 0:
            raise ValueError(f"{item}: refused")
        return {"id": item, "name": f"p{item}"}

    gc: GroupCommit[int, dict[str, Any]] = GroupCommit(plain_db, _insert_many, prepare=prepare, name="test")
    results: dict[int, Any] = {}
    start = threading.Barrier(6)

    def caller(k: int) -> None:
        start.wait()
        for item in range(k * 10, k * 10 + 10):
            try:
                results[item] = gc.write(item, timeout=60)
            except ValueError as e:
                results[item] = e

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    gc.close()
    for item in range(60):
        if item % 3 == 0:
            assert isinstance(results[item], ValueError) and str(results[item]) == f"{item}: refused"
        else:
            assert results[item] == {"id": item, "name": f"p{item}"}
    assert _names(plain_db) == [f"p{i}" for i in range(60) if i % 3]
    assert len(seen_rows) == 60


def _one_batch(gc: GroupCommit[int, Any], release: threading.Event, calls: list[int], items: range) -> list[Any]:
    """Write item 0 (whose prepare step waits for `release`), queue `items` behind it, release: the writer then
    takes all of `items` as one batch. Their outcomes, in order."""
    first = threading.Thread(target=gc.write, args=(0,), kwargs={"timeout": 60})
    first.start()
    while not calls:
        time.sleep(0.01)

    async def main() -> list[Any]:
        waits = [asyncio.ensure_future(gc.write_async(i, timeout=30)) for i in items]
        await asyncio.sleep(0.2)  # all queued
        release.set()
        return list(await asyncio.gather(*waits, return_exceptions=True))

    results = asyncio.run(main())
    first.join(30)
    return results


def test_a_database_error_in_the_prepare_step_fails_the_batch_at_once_and_writes_none_of_it(
    plain_db: Database,
) -> None:
    """The prepare step's statements are fixed: if the database fails one, it would fail the others too (it is
    down), so the whole batch is told at once, nothing of it is written, and the writer goes on with the next."""
    calls: list[int] = []
    release = threading.Event()

    def prepare(s: Session, item: int) -> dict[str, Any]:
        calls.append(item)
        if item == 0:
            release.wait(30)  # items 1-20 queue up meanwhile: the next batch is all of them
        if item == 7:
            s.execute(sa.text("SELECT * FROM no_such_table"))
        s.execute(sa.select(ITEMS.c.id)).all()
        return {"id": item, "name": str(item)}

    gc: GroupCommit[int, dict[str, Any]] = GroupCommit(plain_db, _insert_many, prepare=prepare, name="test")
    results = _one_batch(gc, release, calls, range(1, 21))
    assert all(isinstance(r, sa.exc.DBAPIError) for r in results), results
    assert calls == list(range(8))  # not tried item by item past the failure
    assert gc.write(100, timeout=30) == {"id": 100, "name": "100"}  # the writer goes on
    gc.close()
    assert _names(plain_db) == ["0", "100"]  # nothing of the failed batch


def test_an_item_whose_caller_gave_up_is_not_written(plain_db: Database) -> None:
    """A caller told its write timed out must not find it written later (it may retry: a duplicate)."""
    release = threading.Event()

    def prepare(s: Session, item: int) -> dict[str, Any]:
        if item == 0:
            release.wait(30)  # the writer is busy with the first item while the second caller gives up
        return {"id": item, "name": str(item)}

    gc: GroupCommit[int, dict[str, Any]] = GroupCommit(plain_db, _insert_many, prepare=prepare, name="test")
    first = threading.Thread(target=gc.write, args=(0,), kwargs={"timeout": 60})
    first.start()
    time.sleep(0.2)
    with pytest.raises(TimeoutError):
        gc.write(1, timeout=0.2)

    async def gives_up() -> None:
        with pytest.raises(TimeoutError):
            await gc.write_async(2, timeout=0.2)

    asyncio.run(gives_up())
    release.set()
    first.join(30)
    assert gc.write(3, timeout=30) == {"id": 3, "name": "3"}
    gc.close()
    assert _names(plain_db) == ["0", "3"]


def test_a_dead_pooled_connection_in_the_prepare_step_is_retried_once_on_a_fresh_one(plain_db: Database) -> None:
    """A stale connection (the database restarted) must not fail a whole batch of submissions: the rest of the
    batch is prepared once more on a fresh connection; a second failure fails the batch."""
    dead = {3: 1, 9: 2, 20: 1}  # item → how many times its check meets a dead connection
    release = threading.Event()
    calls: list[int] = []

    def prepare(s: Session, item: int) -> dict[str, Any]:
        calls.append(item)
        if item == 0:
            release.wait(30)  # items 1-12 queue up meanwhile: the next batch is all of them
        if dead.get(item, 0) > 0:
            dead[item] -= 1
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"),
                                          connection_invalidated=True)  # fmt: skip
        return {"id": item, "name": str(item)}

    gc: GroupCommit[int, dict[str, Any]] = GroupCommit(plain_db, _insert_many, prepare=prepare, name="test")
    results = _one_batch(gc, release, calls, range(1, 13))
    # item 3 met a dead connection once: retried, fine; item 9 twice: the batch (1-12) fails at the second
    assert all(isinstance(r, sa.exc.OperationalError) for r in results), results
    assert calls == [0, *range(1, 4), *range(3, 10)]
    assert gc.write(20, timeout=30) == {"id": 20, "name": "20"}  # one dead connection alone: retried, written
    gc.close()
    assert _names(plain_db) == ["0", "20"]
