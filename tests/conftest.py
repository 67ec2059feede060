"""Fixtures shared by the test suite: databases, one test per backend (SQLite and a real PostgreSQL server)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests import databases

# The CLI sizes its tables by COLUMNS (120 wide without it, as when piped). pytest-xdist's workers get COLUMNS=80 in
# their environment; tests that care about a width set their own, so every test starts from the same, unset one.
os.environ.pop("COLUMNS", None)


ENGINE_MODULES = {
    "ray": ("test_ray_e2e.py", "test_ray_executor.py", "test_ray_open_cluster.py", "test_ray_rank_isolation.py"),
    "slurm": (
        "test_slurm_e2e.py",
        "test_slurm_executor.py",
        "test_slurm_hostile_specs.py",
        "test_slurm_rank_isolation.py",
    ),
}


def xdist_group_of(nodeid: str) -> str:
    """What runs together on one pytest-xdist worker (`-n 2`, as the README runs the suite): a whole module, in
    order, as without xdist (module fixtures, and tests that build on the one before, stay whole); and all the Ray
    modules on one worker, all the Slurm ones on one, so each engine's cluster starts once, not once per worker."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    return next((engine for engine, names in ENGINE_MODULES.items() if name in names), path)


if importlib.util.find_spec("xdist") is not None:

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """xdist's scope scheduler, by `xdist_group_of` (its `--dist loadgroup` marks do not reach pytest 9's ids)."""
        from xdist.scheduler import LoadScopeScheduling

        class ByGroup(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return xdist_group_of(nodeid)

        return ByGroup(config, log)


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str | None]:
    """Admin URL of this session's PostgreSQL server (started on first use, stopped at the end); None if none.

    See ``tests/databases.py`` for where the server comes from and ``postgres_unavailable_reason()`` for why None.
    """
    url = databases.postgres_server()
    try:
        yield url
    finally:
        databases.stop_postgres_server()


def _no_postgres() -> None:
    reason = databases.postgres_unavailable_reason() or "no PostgreSQL server"
    if databases.postgres_required():
        pytest.fail(f"{databases.REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file with suanli's schema at head, made once per session for `db_url` to copy."""
    return databases.migrate_sqlite_template(tmp_path_factory.mktemp("migrated") / "suanli.db")


def _database_url(request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool) -> Iterator[str]:
    path = tmp_path / "suanli.db"
    if request.param == "sqlite":
        if migrated:
            shutil.copyfile(request.getfixturevalue("migrated_sqlite"), path)
        yield f"sqlite+pysqlite:///{path}"
        return
    admin_url = request.getfixturevalue("postgres_admin_url")
    if admin_url is None:
        _no_postgres()
    template = databases.migrated_template(admin_url) if migrated else None
    url = databases.new_database(admin_url, template=template)
    yield url
    databases.drop_database(admin_url, url)


@pytest.fixture(params=_BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """SQLAlchemy URL of a fresh database for this test with suanli's schema at head; the test runs once per backend.

    A copy of one database migrated once per session: migrating costs 0.3-0.5 s, a copy tens of milliseconds, and
    every server start still runs the migrations (a no-op at head). ``sqlite``: a file in the test's tmp_path.
    ``postgresql``: a new database on the session's server, dropped after the test; skipped when there is no server,
    or failed when ``SUANLI_REQUIRE_POSTGRES=1``. Deselect the PostgreSQL variants with ``-m "not postgres"``.
    """
    yield from _database_url(request, tmp_path, migrated=True)


@pytest.fixture(params=_BACKENDS)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """As `db_url`, but empty: for tests of the migrations themselves."""
    yield from _database_url(request, tmp_path, migrated=False)


@pytest.fixture
def db(db_url: str) -> Iterator[Any]:
    """A migrated `suanli.db.engine.Database` on a fresh database of each backend (`migrate` checks it is at head)."""
    from suanli.db.engine import Database
    from suanli.db.migrate import migrate

    database = Database(db_url)
    migrate(database.engine)
    yield database
    database.dispose()


@pytest.fixture
def cheap_password_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Argon2 at its production cost takes ~0.3 s a hash on 2 cores; in-process API tests sign up and log in
    many users and test who may do what, not the hash parameters. (Server processes keep the real cost.)"""
    from argon2 import PasswordHasher

    from suanli.control.accounts import accounts

    monkeypatch.setattr(accounts, "_hasher", PasswordHasher(time_cost=1, memory_cost=8, parallelism=1))


@pytest.fixture
def api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[Any]:
    """The API in-process (ASGI, no sockets) on a fresh database of each backend, lifespan run (migrated,
    prices seeded, admin created); background loops off so tests drive metering themselves."""
    from fastapi.testclient import TestClient

    from suanli.api.app import create_app
    from tests.control_plane import settings

    app = create_app(settings(tmp_path / "home", db_url))
    with TestClient(app) as client:
        yield client


@pytest.fixture
def api_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[datetime], None]:
    """Holds the API's clock (every request's `now`) at a chosen instant for the test, so a test that builds rows
    at times relative to its own now reads them back at that now: however slow the machine, and whichever hour or
    day boundary the test happens to run across."""

    def hold(at: datetime) -> None:
        monkeypatch.setattr("suanli.api.deps.utcnow", lambda: at)

    return hold


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium (Debian's) for every browser test of a module (tests/web_helpers.py). Not one per
    session: Playwright's sync API holds the thread's event loop while it runs, and a later module on the same
    xdist worker that calls `asyncio.run` would fail."""
    from tests.web_helpers import chromium

    with chromium() as b:
        yield b
