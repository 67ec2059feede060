"""Engines and sessions for the two supported databases.

SQLite is the embedded default: one file, WAL journal (readers do not block the writer), foreign keys on,
and a busy timeout so that two processes writing at once wait instead of failing. PostgreSQL is for
production and several server replicas.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import sqlalchemy.exc
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from suanli.db.async_reads import AsyncReads

T = TypeVar("T")


def normalise_url(url: str) -> str:
    """Accept the URLs people write (`postgresql://`, `postgres://`, `sqlite:///x`) and pick our drivers."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if url.startswith("sqlite:///"):
        return "sqlite+pysqlite:///" + url[len("sqlite:///") :]
    return url


BUSY_TIMEOUT_MS = 30_000


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    _enter_wal(cur)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _while_busy(statement: Callable[[], object]) -> bool:
    """Run `statement` until SQLite stops refusing it as busy, trying every 0.2-2 ms for up to the busy timeout:
    True once it ran, False when the time is up. Any other error is raised at once."""
    deadline, pause = time.monotonic() + BUSY_TIMEOUT_MS / 1000, 0.0002
    while time.monotonic() < deadline:
        try:
            statement()
            return True
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
        time.sleep(pause)
        pause = min(pause * 1.5, 0.002)
    return False


def _enter_wal(cur: Any) -> None:
    """`PRAGMA journal_mode=WAL`, retried while busy. Turning a new file (rollback journal) to WAL takes its exclusive
    lock, and SQLite answers "database is locked" at once, without waiting in its busy handler, while another
    connection holds the reserved lock: N processes starting together on a new file (`suanli server --workers N`)
    could fail that way."""
    if not _while_busy(lambda: cur.execute("PRAGMA journal_mode=WAL")):
        cur.execute("PRAGMA journal_mode=WAL")  # one last try, failing with SQLite's own error


# SQLite has one write lock per database. Threads of one process queue for it on a mutex of the file's, and are
# handed it the moment it is free; only the thread at the head of the queue contends with other processes,
# polling every fraction of a millisecond. (SQLite's own busy handler sleeps 1, 2, 5, ... 100 ms between tries,
# so a waiter could sleep long after the lock was freed: requests queued behind a background loop's writes.)
class DatabaseUnavailable(RuntimeError):
    """The database could not be reached, or did not answer in time: the request may be retried."""


# PostgreSQL errors that say "not now": connection exceptions, insufficient resources (too many connections),
# operator intervention (shutdown, restart), a rolled-back deadlock or serialization failure, a lock not had.
_TRANSIENT_SQLSTATE_CLASSES = ("08", "53", "57", "40")
_TRANSIENT_SQLSTATES = ("55P03",)


def _transient_sqlstate(state: str | None) -> bool:
    """None: the error arose on the client's side (no connection, a lost one)."""
    return state is None or state[:2] in _TRANSIENT_SQLSTATE_CLASSES or state in _TRANSIENT_SQLSTATES


def transient(exc: BaseException) -> bool:
    """Whether a database error means "unavailable right now, try again" rather than a fault of the request or of
    the code: no connection could be made or it was lost, PostgreSQL is shutting down or out of connections, or
    rolled the transaction back (deadlock, serialization failure, a lock not had), SQLite stayed busy or locked,
    or a read did not answer in time. Anything else (a missing table, a syntax error,
    a read-only or broken file) is a bug or a broken install and must not be retried."""
    if isinstance(exc, DatabaseUnavailable):
        return True
    if not isinstance(exc, sqlalchemy.exc.OperationalError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    if isinstance(orig, sqlite3.OperationalError):
        return getattr(orig, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return _transient_sqlstate(getattr(orig, "sqlstate", ""))


_WRITERS: dict[str, threading.Lock] = {}
_WRITERS_LOCK = threading.Lock()
_HOLDS = "suanli_writer"  # the mutex, in the connection record's info while its transaction holds it


def _writer_of(path: str) -> threading.Lock:
    if not path or path == ":memory:":
        return threading.Lock()  # a database of its own
    with _WRITERS_LOCK:
        return _WRITERS.setdefault(str(Path(path).resolve()), threading.Lock())


def _sqlite_begin(writer: threading.Lock, conn: Any) -> None:
    # A writing transaction takes the write lock at BEGIN: a read-then-write (balance check, lease claim)
    # cannot then fail half-way with "database is locked" when another process commits between its read and
    # its write. Read-only sessions begin deferred, so readers never queue behind writers (WAL).
    if not conn.get_execution_options().get("writes"):
        conn.exec_driver_sql("BEGIN")
        return
    if not writer.acquire(timeout=BUSY_TIMEOUT_MS / 1000):
        raise DatabaseUnavailable(f"no SQLite write lock within {BUSY_TIMEOUT_MS / 1000:.0f} s in this process")
    conn.info[_HOLDS] = writer
    try:
        _begin_immediate(conn)
    except BaseException:
        _release_writer(conn.info)
        raise


def _begin_immediate(conn: Any) -> None:
    """BEGIN IMMEDIATE, retried every 0.2-2 ms while another process holds the write lock."""
    raw = conn.connection.driver_connection
    raw.execute("PRAGMA busy_timeout=0")
    try:
        if not _while_busy(lambda: raw.execute("BEGIN IMMEDIATE")):
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # one last try, failing as SQLAlchemy reports it
    finally:
        raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


def _release_writer(info: dict[Any, Any]) -> None:
    writer = info.pop(_HOLDS, None)
    if writer is not None:
        writer.release()


def _end(conn: Any, statement: str) -> None:
    """The commit or rollback event fires before SQLAlchemy ends the transaction: end it here, on the driver's
    connection, so that the next writer is handed a lock that is really free (SQLAlchemy's own call then finds
    no transaction open and does nothing). A COMMIT that fails keeps the mutex for the rollback that follows."""
    if conn.invalidated or _HOLDS not in conn.info:
        return
    raw = conn.connection.driver_connection
    if raw.in_transaction:
        try:
            raw.execute(statement)
        except sqlite3.Error:
            if statement == "COMMIT":
                raise
    _release_writer(conn.info)


def _on_commit(conn: Any) -> None:
    _end(conn, "COMMIT")


def _on_rollback(conn: Any) -> None:
    _end(conn, "ROLLBACK")


def _on_pool_return(_dbapi_conn: Any, record: Any, *_: Any) -> None:  # checkin or invalidate: never leak it
    _release_writer(record.info)


CONNECT_TIMEOUT_S = 10


KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


class Database:
    """An engine and its session factory."""

    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        self.url = normalise_url(url)
        if self.url.startswith("sqlite"):
            path = self.url.split("///", 1)[1] if "///" in self.url else ""
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = create_engine(
                self.url, connect_args={"check_same_thread": False, "isolation_level": None}, pool_size=pool_size
            )
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", functools.partial(_sqlite_begin, _writer_of(path)))
            event.listen(self.engine, "commit", _on_commit)
            event.listen(self.engine, "rollback", _on_rollback)
            for name in ("checkin", "invalidate"):
                event.listen(self.engine.pool, name, _on_pool_return)
        else:
            # No pre-ping (a round trip per checkout); connections are recycled instead, and a dead one fails the
            # request (or the batch of submissions) that meets it, which clients retry.
            # A database that cannot be reached fails a connection in seconds, not after the OS's TCP timeout
            # (minutes), during which requests would queue behind it (unless the URL sets its own).
            given = make_url(self.url).query
            connect: dict[str, Any] = {} if "connect_timeout" in given else {"connect_timeout": CONNECT_TIMEOUT_S}
            # A peer that vanished without closing (a network cut) is noticed in about a minute, not hours.
            if not any(k.startswith("keepalives") for k in given):
                connect.update(KEEPALIVES)
            self.engine = create_engine(
                self.url, pool_size=pool_size, max_overflow=20, pool_recycle=1800, connect_args=connect
            )
        # Reads on PostgreSQL run on their own autocommit pool: each statement sees a consistent snapshot, and
        # neither BEGIN/ROLLBACK nor a per-checkout isolation switch costs a round trip. (SQLite reads are local
        # calls; their deferred BEGIN costs nothing.)
        self.read_engine = self.engine
        if self.engine.dialect.name != "sqlite":
            self.read_engine = create_engine(
                self.url, pool_size=pool_size, max_overflow=20, pool_recycle=1800, isolation_level="AUTOCOMMIT",
                connect_args=connect,
            )  # fmt: skip
        self._pool_size = pool_size
        self._connect_args: dict[str, Any] = {} if self.embedded else connect
        self._compiled: dict[int, tuple[Any, str, dict[str, Any]]] = {}
        self._async_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncReads] = (
            weakref.WeakKeyDictionary()
        )
        reads = self.read_engine
        self.reads = sessionmaker(reads, expire_on_commit=False)
        self.writes = sessionmaker(self.engine.execution_options(writes=True), expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def embedded(self) -> bool:
        """A statement is a call into this process (SQLite), not a network round trip."""
        return self.engine.dialect.name == "sqlite"

    def read(self) -> Session:
        """A session for a request that only reads."""
        return self.reads()

    def read_connection(self) -> Connection:
        """A bare connection for the hottest reads: one precompiled statement, no ORM session around it."""
        return self.read_engine.connect()

    def write(self) -> Session:
        """A session for a transaction that writes (on SQLite it holds the write lock from its first statement)."""
        return self.writes()

    async def short_read(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` (a read of a statement or two) on a read connection for an async route. On SQLite it runs
        inline: a statement is a local call of tens of microseconds, and the hop to the thread pool and back costs
        more (a GIL hand-off each way). Across a network (PostgreSQL) it runs in the thread pool, so the event
        loop serves other requests while the database answers."""
        if self.embedded:
            return self._read_with(fn)
        return await anyio.to_thread.run_sync(self._read_with, fn)

    def _read_with(self, fn: Callable[[Connection], T]) -> T:
        with self.read_engine.connect() as c:
            return fn(c)

    async def read_one(self, statement: Any, params: dict[str, Any]) -> tuple[Any, ...]:
        """One row of a read statement built once (module level), for the hottest reads of async routes. On SQLite
        inline, as `short_read`.
        On PostgreSQL over psycopg's own asyncio connections, reused per event loop: ~0.08 ms of CPU a
        read, against ~0.35 ms for SQLAlchemy's sync path plus the hop to a thread and back. The statement is
        compiled once; results come back as the driver gives them (no SQLAlchemy result processing: plain
        columns and numerics only)."""
        if self.embedded:
            return self._read_with(lambda c: tuple(c.execute(statement, params).one()))
        hit = self._compiled.get(id(statement))
        if hit is None or hit[0] is not statement:
            compiled = statement.compile(dialect=self.engine.dialect)
            if compiled.post_compile_params or compiled.literal_execute_params:
                raise ValueError("read_one takes statements whose SQL does not depend on their values (no IN lists)")
            hit = self._compiled[id(statement)] = (statement, str(compiled), dict(compiled.params))
        _, sql, defaults = hit  # defaults: the values of the statement's own literals
        import psycopg

        pool = await self._async_pool()
        try:
            row = await pool.fetch_one(sql, {**defaults, **params})
        except TimeoutError:
            raise DatabaseUnavailable(f"no answer within {pool.timeout_s:g} s") from None
        except psycopg.OperationalError as e:
            if not _transient_sqlstate(e.sqlstate):
                raise
            raise DatabaseUnavailable(str(e)) from e
        if row is None:
            raise LookupError("the statement returned no row")
        return tuple(row)

    async def _async_pool(self) -> AsyncReads:
        loop = asyncio.get_running_loop()
        pool = self._async_pools.get(loop)
        if pool is None:
            _, params = self.engine.dialect.create_connect_args(self.engine.url)  # as the sync pools connect
            pool = self._async_pools[loop] = AsyncReads({**params, **self._connect_args}, self._pool_size)
        return pool

    async def aclose(self) -> None:
        """Close this event loop's asyncio connections (the app's lifespan, before `dispose`)."""
        pool = self._async_pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    def dispose(self) -> None:
        self.engine.dispose()
        self.read_engine.dispose()


def exclusive(s: Session, key: int) -> None:
    """Hold a database-wide lock named `key` until the transaction ends, so that processes doing the same
    one-off work (start-up seeding) take turns: an advisory lock on PostgreSQL; on SQLite a writing session
    already holds the only write lock."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
