"""The server's own database, opened by a command on the server host with no server running (migrated first):
`suanli admin create-user` and `set-password` (`cli/admin_users.py`), and the hub's operator commands
(`cli/hub.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from suanli.cli.common import fail

if TYPE_CHECKING:
    from suanli.control.settings import Settings
    from suanli.db.engine import Database

DbOpt = Annotated[
    str | None, typer.Option("--db", help="Database URL (default: SUANLI_DB, else SQLite in SUANLI_HOME).")
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="The server's YAML settings file.")]


@contextmanager
def open_database(db: str | None, config: Path | None) -> Iterator[tuple[Settings, Database]]:
    """The server's settings and its database, migrated; settings that do not load end the command."""
    from suanli.api.app import bootstrap
    from suanli.control.errors import ServiceError
    from suanli.control.settings import load
    from suanli.db.engine import Database

    try:
        settings = load({"db": db}, config_file=config)
    except ServiceError as e:
        fail(e.message)
    settings.home.mkdir(parents=True, exist_ok=True)
    database = Database(settings.db_url)
    try:
        bootstrap(database, settings)
        yield settings, database
    finally:
        database.dispose()
