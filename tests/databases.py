"""Databases for the test suite: a throwaway PostgreSQL server per test session, and fresh databases on it.

No tests here; ``tests/conftest.py`` builds the ``postgres_admin_url`` and ``db_url`` fixtures on this module.

Where the PostgreSQL server comes from, in order:

1. ``SUANLI_TEST_POSTGRES_URL`` (an existing server, e.g. ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``;
   the role must be allowed to CREATE and DROP DATABASE). ``db_url`` drops each database it made after its test;
   ``stop_postgres_server()`` drops any made here that are left.
2. ``initdb`` and ``pg_ctl`` on PATH or under ``/usr/lib/postgresql/*/bin`` (highest version): a new cluster in a
   temporary directory (/dev/shm when it has room), trust auth on loopback, a free port, durability off for speed;
   stopped and removed at the end of the session (or at interpreter exit). As root, initdb refuses to run, so both
   run as the ``postgres`` system user (Debian's ``postgresql`` package creates it) through ``runuser``.
3. Neither: no server. Tests that need one are skipped, or fail when ``SUANLI_REQUIRE_POSTGRES=1`` (as on CI).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

URL_ENV = "SUANLI_TEST_POSTGRES_URL"
REQUIRE_ENV = "SUANLI_REQUIRE_POSTGRES"
SYSTEM_USER = "postgres"  # the OS account that runs initdb/pg_ctl when we are root
SUPERUSER = "postgres"  # the database superuser created by initdb
DB_PREFIX = "suanli_test_"

# Durability is pointless for a throwaway cluster; these make it several times faster to start and to use.
_SERVER_OPTIONS = (
    "-c listen_addresses=127.0.0.1",
    "-c fsync=off",
    "-c synchronous_commit=off",
    "-c full_page_writes=off",
    "-c max_connections=200",
)


def postgres_required() -> bool:
    """True when a missing PostgreSQL server must fail the run rather than skip (``SUANLI_REQUIRE_POSTGRES=1``)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def find_pg_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: PATH first, else the newest ``/usr/lib/postgresql/*/bin``."""
    initdb = shutil.which("initdb")
    if initdb:
        bindir = Path(initdb).resolve().parent
        if (bindir / "pg_ctl").exists():
            return bindir
    candidates = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    candidates = [d for d in candidates if (d / "pg_ctl").exists()]

    def version(d: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", d.parent.name)) or (0,)

    return max(candidates, key=version) if candidates else None


def _scratch_dir() -> str | None:
    """Where the cluster lives: /dev/shm (tmpfs) when it has room, since CREATE DATABASE there is ~10x faster than
    on a disk filesystem; else the default temporary directory. The cluster is a few tens of MB."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if os.access(shm, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= 1 << 30:
        return shm
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TempPostgres:
    """A PostgreSQL cluster in a temporary directory, started with pg_ctl; ``stop()`` stops it and removes it."""

    bindir: Path
    root: Path = field(init=False)
    port: int = 0
    _runas: list[str] = field(default_factory=list)
    _owner_pid: int = field(default_factory=os.getpid)
    _started: bool = False

    def __post_init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="suanli-pg-", dir=_scratch_dir()))
        if os.geteuid() == 0:
            user = pwd.getpwnam(SYSTEM_USER)  # KeyError: the caller reports it
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._runas = ["runuser", "-u", SYSTEM_USER, "--"]

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        return self.root / "server.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        for var in ("PGDATA", "PGPORT", "PGHOST", "PGUSER", "PGDATABASE", "PGOPTIONS"):
            env.pop(var, None)
        return subprocess.run(
            [*self._runas, *args],
            cwd=self.root,  # the postgres user may not be able to read the caller's working directory
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, attempts: int = 3) -> None:
        initdb = str(self.bindir / "initdb")
        init = self._run(
            initdb, "-D", str(self.datadir), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {(init.stderr or init.stdout).strip()[-2000:]}")
        last = ""
        for _ in range(attempts):  # a free port can be taken between choosing it and binding it: retry
            self.port = _free_port()
            opts = " ".join((*_SERVER_OPTIONS, f"-p {self.port}", f"-k {self.root}"))
            pg_ctl = str(self.bindir / "pg_ctl")
            ctl = self._run(
                pg_ctl, "start", "-w", "-t", "60", "-D", str(self.datadir), "-l", str(self.logfile), "-o", opts
            )
            if ctl.returncode == 0:
                self._started = True
                return
            last = (ctl.stderr or ctl.stdout).strip() + "\n" + self.log_tail()
        raise RuntimeError(f"pg_ctl start failed: {last.strip()[-2000:]}")

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if os.getpid() != self._owner_pid:  # a forked child must not stop its parent's server
            return
        if self._started or (self.datadir / "postmaster.pid").exists():
            self._started = False
            with contextlib.suppress(Exception):
                self._run(str(self.bindir / "pg_ctl"), "stop", "-D", str(self.datadir), "-m", "immediate", "-w")
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class _State:
    resolved: bool = False
    url: str | None = None
    reason: str = ""
    server: TempPostgres | None = None
    external: bool = False
    created: list[str] = field(default_factory=list)
    template: str | None = None  # the migrated database `migrated_template` made


_STATE = _State()


def _sqlalchemy_url(url: str) -> str:
    """``url`` with the psycopg 3 driver named, as SQLAlchemy wants it (``postgresql://`` means psycopg2 there)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.drivername in {"postgres", "postgresql"}:
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def _libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as a libpq connection URI for ``psycopg.connect``."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def postgres_server() -> str | None:
    """The admin URL of this session's PostgreSQL server, starting one on first call; None when none can be had.

    The result (and the reason when None, see ``postgres_unavailable_reason``) is cached for the process. A server
    started here is stopped by ``stop_postgres_server()`` or, failing that, at interpreter exit.
    """
    if _STATE.resolved:
        return _STATE.url
    _STATE.resolved = True
    external = os.environ.get(URL_ENV, "").strip()
    if external:
        _STATE.url = _sqlalchemy_url(external)
        _STATE.external = True
        return _STATE.url
    bindir = find_pg_bindir()
    if bindir is None:
        _STATE.reason = (
            f"no PostgreSQL server: set {URL_ENV}, or install PostgreSQL's server binaries "
            "(initdb and pg_ctl on PATH or under /usr/lib/postgresql/*/bin; Debian: apt-get install postgresql)"
        )
        return None
    if os.geteuid() == 0 and (shutil.which("runuser") is None or not _user_exists(SYSTEM_USER)):
        _STATE.reason = (
            f"no PostgreSQL server: running as root, and initdb refuses root, but there is no {SYSTEM_USER!r} "
            "system user (or no runuser) to run it as; Debian's postgresql package creates that user"
        )
        return None
    server = TempPostgres(bindir)
    atexit.register(server.stop)
    try:
        server.start()
    except Exception as exc:
        server.stop()
        _STATE.reason = f"could not start a throwaway PostgreSQL server from {bindir}: {exc}"
        return None
    _STATE.server = server
    _STATE.url = server.url
    return _STATE.url


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def postgres_unavailable_reason() -> str:
    """Why ``postgres_server()`` returned None (empty when it did not)."""
    return _STATE.reason


def stop_postgres_server() -> None:
    """End of session: drop the databases made on an external server, or stop and remove our own server."""
    if _STATE.external and _STATE.url and _STATE.created:
        with contextlib.suppress(Exception):
            drop_databases(_STATE.url, _STATE.created)
    _STATE.created.clear()
    _STATE.template = None
    if _STATE.server is not None:
        _STATE.server.stop()
        _STATE.server = None
    _STATE.resolved = False
    _STATE.url = None
    _STATE.external = False


def new_database(admin_url: str, template: str | None = None) -> str:
    """CREATE a new database with a unique name on the server of ``admin_url``: empty, or a copy of ``template``
    (a database made here, with no connections open to it); return its SQLAlchemy URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"{DB_PREFIX}{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_libpq_url(admin_url), autocommit=True) as conn:
        # PostgreSQL 15+ copies the template through the WAL by default. With fsync off (our throwaway server) a
        # plain file copy, whose checkpoints then cost nothing, is twice as fast.
        fsync = conn.execute("SHOW fsync").fetchone()
        file_copy = conn.info.server_version >= 150000 and fsync is not None and fsync[0] == "off"
        strategy = " STRATEGY = FILE_COPY" if file_copy else ""
        source = f' TEMPLATE "{template}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{source}{strategy}')
    _STATE.created.append(name)
    return make_url(_sqlalchemy_url(admin_url)).set(database=name).render_as_string(hide_password=False)


def migrated_template(admin_url: str) -> str:
    """The name of a database on the server of ``admin_url`` with suanli's schema at head, migrated once per session
    (0.4-0.5 s; a copy of it takes tens of milliseconds); ``new_database(admin_url, template=...)`` copies it."""
    if _STATE.template is None:
        from sqlalchemy.engine import make_url

        from suanli.db.engine import Database
        from suanli.db.migrate import migrate

        url = new_database(admin_url)
        db = Database(url)
        try:
            migrate(db.engine)
        finally:
            db.dispose()  # a template must have no connections open
        _STATE.template = make_url(url).database
    return _STATE.template


def migrate_sqlite_template(path: Path) -> Path:
    """Make ``path`` a SQLite file with suanli's schema at head, its WAL folded into the file, and return it."""
    import sqlite3

    from suanli.db.engine import Database
    from suanli.db.migrate import migrate

    db = Database(f"sqlite+pysqlite:///{path}")
    try:
        migrate(db.engine)
    finally:
        db.dispose()
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path


def drop_database(admin_url: str, name_or_url: str) -> None:
    """DROP one database made by ``new_database`` (by name or URL), closing any connections still open to it."""
    drop_databases(admin_url, [name_or_url])


def drop_databases(admin_url: str, names_or_urls: list[str]) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    names = [make_url(n).database if "://" in n else n for n in names_or_urls]
    with psycopg.connect(_libpq_url(admin_url), autocommit=True) as conn:
        for name in names:
            if not name or not name.startswith(DB_PREFIX):
                raise ValueError(f"refusing to drop {name!r}: not a database made by new_database")
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            with contextlib.suppress(ValueError):
                _STATE.created.remove(name)
