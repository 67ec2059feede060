"""`suanli server`: the control plane's HTTP server (FastAPI on uvicorn) with the embedded default database."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from suanli.cli.common import fail
from suanli.control.errors import ServiceError
from suanli.control.settings import Settings, load
from suanli.topology.presets import preset_spec
from suanli.topology.spec import SpecError


def server(
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port (default 8000; 0 picks a free one).")] = None,
    ssh_port: Annotated[int | None, typer.Option("--ssh-port", help="SSH gateway port (default 2222; 0: off).")] = None,
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
    virtual: Annotated[
        list[str] | None,
        typer.Option(
            "--virtual", help="Register a topology preset as virtual nodes on start, unless registered (repeatable)."
        ),
    ] = None,
    no_background: Annotated[
        bool, typer.Option("--no-background", help="Serve the API only; run no background loops (metering).")
    ] = False,
    ray: Annotated[
        str | None, typer.Option("--ray", metavar="ADDRESS", help="Run on this Ray cluster (its GPU nodes join).")
    ] = None,
    slurm: Annotated[bool, typer.Option("--slurm", help="Run on the Slurm cluster this host submits to.")] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "info",
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            max=64,
            help="Server processes sharing the port; the background loops run once, beside them.",
        ),
    ] = 1,
) -> None:
    """Run the API server (REST under /api/v1, OpenAPI at /docs); migrates the database on start."""
    import uvicorn

    from suanli.api.app import SETTINGS_ENV, create_app

    flags = {"host": host, "port": port, "db": db, "home": home, "background": False if no_background else None,
             "virtual": virtual or None, "ssh_port": ssh_port, "ray_address": ray, "slurm": slurm or None}  # fmt: skip
    settings = _settings(flags, config)
    _port_free(settings)
    typer.echo(
        f"suanli server on http://{settings.host}:{settings.port}  (database: {_redact(settings.db_url)})", err=True
    )
    _ssh_note(settings)
    _origin_note(settings)
    _sandbox_note(settings)
    if workers == 1:
        from suanli.cli.malloc import tune_for_streams

        tune_for_streams()  # volume copies stream GiBs through this process
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level, access_log=False,
                    **forwarding(settings))  # fmt: skip
        return
    # Several processes: each builds its app from the resolved settings handed over in the environment. The
    # background loops run once, beside them, not once per worker: a loop needs one process, and idle copies
    # polling for its lease cost CPU the workers could use.
    background = gateway = None
    if settings.background:
        from suanli.api.app import bootstrap
        from suanli.control.background import BackgroundProcess
        from suanli.db.engine import Database

        db = Database(settings.db_url)
        try:
            bootstrap(db, settings)  # the loops need the schema before any worker has migrated it
        finally:
            db.dispose()
        background = BackgroundProcess(settings)
        background.start()
        if settings.ssh_port:
            from suanli.control.workloads.ssh_gateway import GatewayProcess

            gateway = GatewayProcess(settings)
            gateway.start()
    os.environ[SETTINGS_ENV] = settings.model_copy(update={"background": False}).model_dump_json()
    # uvicorn kills a worker that does not answer its health ping within `timeout_worker_healthcheck` (5 s by
    # default), and a freshly spawned one answers only once it has imported the app: on a busy host that takes
    # longer, and the default made the server kill and respawn its workers in a loop.
    try:
        uvicorn.run("suanli.api.app:app_from_environment", factory=True, host=settings.host, port=settings.port,
                    workers=workers, log_level=log_level, access_log=False, timeout_worker_healthcheck=60,
                    **forwarding(settings))  # fmt: skip
    finally:
        if gateway is not None:
            gateway.stop()
        if background is not None:
            background.stop()


def up(
    virtual: Annotated[
        list[str] | None,
        typer.Option("--virtual", help="Also register a topology preset as virtual nodes (repeatable)."),
    ] = None,
    no_local: Annotated[bool, typer.Option("--no-local", help="Do not register this host as a node.")] = False,
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port (default 8000).")] = None,
    ssh_port: Annotated[int | None, typer.Option("--ssh-port", help="SSH gateway port (default 2222; 0: off).")] = None,
    db: Annotated[str | None, typer.Option("--db", help="Database URL; default: SQLite in SUANLI_HOME.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="YAML settings file.")] = None,
    home: Annotated[Path | None, typer.Option("--home", help="Data directory (default: SUANLI_HOME).")] = None,
    ray: Annotated[str | None, typer.Option("--ray", metavar="ADDRESS", help="Also run on this Ray cluster.")] = None,
    slurm: Annotated[bool, typer.Option("--slurm", help="Also run on this host's Slurm cluster.")] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
) -> None:
    """Bring the platform up on this host: the server, the scheduling loop, the local executor, this host as a
    node (and virtual nodes with --virtual), and this CLI logged in as the local operator. Ctrl-C stops it;
    running local workloads keep running and are re-attached on the next start."""
    import uvicorn

    from suanli.api.app import bootstrap, create_app
    from suanli.cli import credentials
    from suanli.control import local
    from suanli.control.ids import utcnow
    from suanli.db.engine import Database

    flags = {"host": host, "port": port, "db": db, "home": home, "virtual": virtual or None, "ssh_port": ssh_port,
             "ray_address": ray, "slurm": slurm or None}  # fmt: skip
    settings = _settings(flags, config)
    _port_free(settings)
    database = Database(settings.db_url)
    bootstrap(database, settings)
    url = f"http://{settings.host}:{settings.port}"
    with database.write() as s, s.begin():
        if not no_local:
            row, new = local.ensure_host(s, utcnow())
            node = row.spec.get("host") or row.name
            typer.echo(f"{'registered' if new else 'node'}: this host ({node})", err=True)
        if not local.token_works(s, credentials.token_for(url), utcnow()):
            email, token = local.operator_token(s, settings.home, utcnow(), settings.trial_credit)
            credentials.save(url, token, email)
            typer.echo(f"logged in as {email} (operator); its password is in {settings.home / local.PASSWORD_FILE}",
                       err=True)  # fmt: skip
    typer.echo(f"suanli up on {url}  (database: {_redact(settings.db_url)}); try: suanli run examples/hello.yaml "
               "--follow", err=True)  # fmt: skip
    typer.echo(f"web console: {url}/ (log in as {local.OPERATOR_EMAIL} with the password in "
               f"{settings.home / local.PASSWORD_FILE}, or sign up as a tenant)", err=True)  # fmt: skip
    _ssh_note(settings)
    _origin_note(settings)
    _sandbox_note(settings)
    uvicorn.run(create_app(settings, database), host=settings.host, port=settings.port, log_level=log_level,
                access_log=False, **forwarding(settings))  # fmt: skip


def forwarding(settings: Settings) -> dict[str, Any]:
    """uvicorn's proxy headers: believed only from the reverse proxies the operator names (`trusted_proxies`).
    uvicorn's own default believes 127.0.0.1, where every tenant job on this host (host network) connects from: a
    forged X-Forwarded-For made each request a new address to the signup limit and the login throttle."""
    if not settings.trusted_proxies.strip():
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": settings.trusted_proxies}


def _settings(flags: dict[str, object], config: Path | None) -> Settings:
    """The resolved settings, or a clear error: presets are checked before anything starts."""
    try:
        settings = load(flags, config_file=config)
    except ServiceError as e:
        fail(e.message)
    for preset in settings.virtual:
        try:
            preset_spec(preset)
        except SpecError as e:
            fail(f"--virtual: {e}")
    if settings.slurm and (settings.slurm_rest or "").startswith(("http://", "https://")):
        from suanli.executors.slurm_rest import TOKEN_ENV

        if not os.environ.get(TOKEN_ENV):  # else the background loops would fail to start, again and again
            fail(f"slurm rest {settings.slurm_rest}: set {TOKEN_ENV} to a token for slurmrestd (`scontrol token`)")
    settings.home.mkdir(parents=True, exist_ok=True)
    return settings


def _port_free(settings: Settings) -> None:
    """Before anything starts or is printed: the port must be free. A suanli server already there is named (a
    second `suanli up`); another program holding it is said to; either way a non-zero exit."""
    if settings.port == 0:
        return
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no owner
            sock.bind((settings.host, settings.port))
    except OSError as e:
        where = f"{settings.host}:{settings.port}"
        if e.errno != errno.EADDRINUSE:
            fail(f"cannot listen on {where}: {e.strerror or e}")
        probe = "127.0.0.1" if settings.host in ("0.0.0.0", "") else "::1" if settings.host == "::" else settings.host
        url = f"http://{probe}:{settings.port}" if ":" not in probe else f"http://[{probe}]:{settings.port}"
        running = _suanli_at(url)
        if running is not None:
            fail(f"suanli is already up on {url} ({running}); use it (suanli run …), or stop it first, or give "
                 "another --port")  # fmt: skip
        fail(f"port {settings.port} on {settings.host} is in use by another program; give another --port")


def _suanli_at(url: str) -> str | None:
    """`version V, database D` when a suanli server answers at `url`, else None."""
    import httpx

    try:
        doc = httpx.get(f"{url}/healthz", timeout=2.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("status") != "ok" or "version" not in doc:
        return None
    return f"version {doc['version']}, database {doc.get('database', '?')}"


def _sandbox_note(settings: Settings) -> None:
    from suanli.control.workloads.sandboxes import sandbox_policy

    typer.echo(sandbox_policy(settings).startup_note(), err=True)


def _ssh_note(settings: Settings) -> None:
    if settings.ssh_port and settings.background:
        typer.echo(f"ssh gateway on {settings.host}:{settings.ssh_port}: suanli keys add ~/.ssh/id_ed25519.pub, then "
                   f"ssh -p {settings.ssh_port} INSTANCE@{settings.host}  (--ssh-port 0 turns it off)", err=True)  # fmt: skip


def _origin_note(settings: Settings) -> None:
    """Without `proxy_url`, instances' web pages share the console's origin: say what that means (docs/web.md)."""
    if not settings.proxy_url:
        typer.echo("note: instances' web pages (JupyterLab, ports) are served on the console's own origin; a "
                   "tenant's page there could act in the console as a visitor. For strangers, set proxy_url in the config "
                   "(a wildcard host of its own, with HTTPS): docs/jupyter-and-ports.md", err=True)  # fmt: skip


def _redact(url: str) -> str:
    """The database URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}" if ":" in creds else url
    return url
