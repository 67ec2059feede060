"""Engines and sessions for the two supported databases.

SQLite is the embedded default: one file, WAL journal (readers do not block the writer), foreign keys on,
and a busy timeout so that two processes writing at once wait instead of failing. PostgreSQL is for
production and several server replicas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker


def normalise_url(url: str) -> str:
    """Accept the URLs people write (`postgresql://`, `postgres://`, `sqlite:///x`) and pick our drivers."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if url.startswith("sqlite:///"):
        return "sqlite+pysqlite:///" + url[len("sqlite:///") :]
    return url


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    # A writing transaction takes the write lock at BEGIN: a read-then-write (balance check, lease claim)
    # cannot then fail half-way with "database is locked" when another process commits between its read and
    # its write. Read-only sessions begin deferred, so readers never queue behind writers (WAL).
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("writes") else "BEGIN")


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
            event.listen(self.engine, "begin", _sqlite_begin)
        else:
            # No pre-ping (a round trip per checkout); connections are recycled instead, and a dead one fails a
            # single request, which the client retries.
            self.engine = create_engine(self.url, pool_size=pool_size, max_overflow=20, pool_recycle=1800)
        # Reads on PostgreSQL run on their own autocommit pool: each statement sees a consistent snapshot, and
        # neither BEGIN/ROLLBACK nor a per-checkout isolation switch costs a round trip. (SQLite reads are local
        # calls; their deferred BEGIN costs nothing.)
        self.read_engine = self.engine
        if self.engine.dialect.name != "sqlite":
            self.read_engine = create_engine(
                self.url, pool_size=pool_size, max_overflow=20, pool_recycle=1800, isolation_level="AUTOCOMMIT"
            )
        reads = self.read_engine
        self.reads = sessionmaker(reads, expire_on_commit=False)
        self.writes = sessionmaker(self.engine.execution_options(writes=True), expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def read(self) -> Session:
        """A session for a request that only reads."""
        return self.reads()

    def read_connection(self) -> Connection:
        """A bare connection for the hottest reads: one precompiled statement, no ORM session around it."""
        return self.read_engine.connect()

    def write(self) -> Session:
        """A session for a transaction that writes (on SQLite it holds the write lock from its first statement)."""
        return self.writes()

    def dispose(self) -> None:
        self.engine.dispose()
        self.read_engine.dispose()


def exclusive(s: Session, key: int) -> None:
    """Hold a database-wide lock named `key` until the transaction ends, so that processes doing the same
    one-off work (start-up seeding) take turns: an advisory lock on PostgreSQL; on SQLite a writing session
    already holds the only write lock."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
