"""`db_url` on SQLite only, for tests whose subject is not the database: the CLI against a live server, the console's
pages. They read and write through the API, whose database behaviour on SQLite and PostgreSQL the API's and the
services' own tests cover; running them once instead of once per backend saves minutes of the suite.

Use: `from tests.sqlite_only import sqlite_db_url  # noqa: F401` in the test module (it overrides conftest's)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(name="db_url")
def sqlite_db_url(tmp_path: Path, migrated_sqlite: Path) -> Iterator[str]:
    """A copy of the session's migrated SQLite file, as conftest's `db_url` gives on SQLite."""
    path = tmp_path / "suanli.db"
    shutil.copyfile(migrated_sqlite, path)
    yield f"sqlite+pysqlite:///{path}"
