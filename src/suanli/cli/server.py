"""`suanli server`: the control plane's HTTP server (FastAPI on uvicorn) with the embedded default database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from suanli.cli.common import fail
from suanli.control.errors import ServiceError
from suanli.control.settings import load


def server(
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port (default 8000; 0 picks a free one).")] = None,
    db: Annotated[
        str | None,
        typer.Option("--db", help="Database URL (postgresql://… or sqlite:///…); default: SQLite in SUANLI_HOME."),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML settings file (flags > SUANLI_* environment > file).")
    ] = None,
    home: Annotated[
        Path | None, typer.Option("--home", help="Data directory (default: SUANLI_HOME or the user data dir).")
    ] = None,
    no_background: Annotated[
        bool, typer.Option("--no-background", help="Serve the API only; run no background loops (metering).")
    ] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "info",
) -> None:
    """Run the API server (REST under /api/v1, OpenAPI at /docs); migrates the database on start."""
    import uvicorn

    from suanli.api.app import create_app

    flags = {"host": host, "port": port, "db": db, "home": home, "background": False if no_background else None}
    try:
        settings = load(flags, config_file=config)
    except ServiceError as e:
        fail(e.message)
    settings.home.mkdir(parents=True, exist_ok=True)
    typer.echo(
        f"suanli server on http://{settings.host}:{settings.port}  (database: {_redact(settings.db_url)})", err=True
    )
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level, access_log=False)


def _redact(url: str) -> str:
    """The database URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}" if ":" in creds else url
    return url
