"""The FastAPI application: routers under /api/v1, errors as JSON with a message, and the server's lifecycle
(migrate on start, seed prices and the first admin, run the background loops)."""

from __future__ import annotations

import functools
import gc
import logging
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from suanli import __version__
from suanli.api.deps import Server, no_nul
from suanli.api.gateway import GatewayState
from suanli.api.gateway_asgi import PREFIX as GATEWAY_PREFIX
from suanli.api.gateway_asgi import Gateway
from suanli.api.routers import (
    admin,
    agent_tokens,
    auth,
    credit,
    endpoints,
    hub,
    instances,
    market,
    members,
    orgs,
    passwords,
    plans,
    reports,
    serve_quotes,
    ssh,
    telemetry,
    volume_files,
    volumes,
    workdirs,
    workloads,
)
from suanli.api.schemas import ErrorOut, ValidationErrorOut
from suanli.control.accounts import accounts
from suanli.control.background import BackgroundProcess
from suanli.control.errors import ServiceError
from suanli.control.ids import utcnow
from suanli.control.money import prices
from suanli.control.scheduling import inventory
from suanli.control.settings import Settings
from suanli.control.telemetry import health
from suanli.db.engine import Database, DatabaseUnavailable, exclusive, transient
from suanli.db.migrate import migrate
from suanli.storage.volumes import TooDeep
from suanli.telemetry.health import HealthJudge
from suanli.topology import presets
from suanli.web import app as web

log = logging.getLogger("suanli.api")

API = "/api/v1"
SAMPLES_BODY_BYTES = 16 << 20  # a node agent's batch: up to 20,000 samples
PROXY_BODY_BYTES = 64 << 20  # a request into an instance (JupyterLab uploads files in chunks of 1 MiB)
PROXY_PREFIX = "/i/"
# Every error is `{"detail": ...}`; documented so clients (and schema-driven tests) know the shape.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "the body could not be parsed"},
    401: {"model": ErrorOut, "description": "no valid bearer token"},
    402: {"model": ErrorOut, "description": "the balance does not cover it; top up first"},
    403: {"model": ErrorOut, "description": "not allowed (operators only, or not for the caller's role in the org)"},
    404: {"model": ErrorOut, "description": "not found, or not visible to the caller"},
    409: {"model": ErrorOut, "description": "conflicts with what exists"},
    413: {"model": ErrorOut, "description": "request body too large"},
    422: {"model": ValidationErrorOut, "description": "invalid input; `detail` names the field"},
    429: {"model": ErrorOut, "description": "too many attempts (logins, signups); retry after `Retry-After`"},
    503: {"model": ErrorOut, "description": "busy or unavailable right now; retry after `Retry-After`"},
}
SETTINGS_ENV = "SUANLI_RESOLVED_SETTINGS"
VOLUME_STREAMS = re.compile(r"/api/v1/volumes/[^/]{1,64}/(?:files|tree)")
BOOTSTRAP_LOCK = 0x5A4E_4253


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, whether or not they declare a length."""

    def __init__(self, app: ASGIApp, limit: int, uploads: dict[str, int] | None = None,
                 streamed: dict[re.Pattern[str], int] | None = None) -> None:  # fmt: skip
        self.app, self.default, self.uploads = app, limit, uploads or {}
        self.streamed = streamed or {}  # routes that stream their body to disk as it comes: paths by pattern

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = self.uploads.get(path, self.default)  # routes that take an upload: their own limit
        for pattern, most in self.streamed.items():
            if pattern.fullmatch(path):
                limit = most
        if path.startswith(PROXY_PREFIX):
            limit = PROXY_BODY_BYTES
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _too_large(limit, send)
            return
        seen, refused = 0, False

        # A streamed (chunked) body is counted as it arrives: past the limit this answers 413 itself and tells
        # the app the client left, and whatever the app then tries to send (FastAPI answers a body it could
        # not read with 400) is dropped.
        async def limited() -> Message:
            nonlocal seen, refused
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > limit:
                if not refused:
                    refused = True
                    await _too_large(limit, send)
                return {"type": "http.disconnect"}
            return msg

        async def guarded(msg: Message) -> None:
            if not refused:
                await send(msg)

        await self.app(scope, limited, guarded)


async def _too_large(limit: int, send: Send) -> None:
    resp = JSONResponse({"detail": f"request body larger than {limit} bytes"}, status_code=413)
    await resp({"type": "http"}, _nothing, send)


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # loc is ("body", character offset)
            where = err.get("loc", ("body", "?"))[-1]
            why = (err.get("ctx") or {}).get("error", "")
            parts.append(f"body: not valid JSON (at character {where}{': ' + why if why else ''})")
            continue
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _parse_failure(exc: StarletteHTTPException) -> str:
    """FastAPI answers 400 "There was an error parsing the body" for JSON that the decoder gives up on."""
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return "body: JSON nested too deeply"
    if cause is not None:
        why = str(cause).split(";")[0].strip()[:200] or type(cause).__name__  # not Python's advice to the server
        return f"body: could not be parsed ({why})"
    return str(exc.detail)


def _db_message(exc: DataError | IntegrityError) -> str:
    """The database's one-line reason (no SQL, no parameters)."""
    return (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0][:300]


_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: [\w.]+\.(\w+)")
_PG_NAMED = re.compile(r'constraint "(\w+)"')


@functools.cache
def _constraint_columns() -> dict[str, str]:
    """Unique constraint and index name → its first column, from the models (PostgreSQL names the constraint)."""
    from sqlalchemy import Index, UniqueConstraint

    from suanli.db.models import Base

    out: dict[str, str] = {}
    for table in Base.metadata.tables.values():
        for c in [*table.constraints, *table.indexes]:
            if isinstance(c, UniqueConstraint | Index) and c.name and list(c.columns):
                out[str(c.name)] = next(iter(c.columns)).name
    return out


_NOT_CHOSEN = frozenset({"sandbox_uid"})  # unique values the server picks: a race there is retried, not re-chosen


def _conflict_message(exc: IntegrityError) -> str:
    """The field that clashed, in words; never the database's constraint or index names, nor its SQL."""
    text = str(exc.orig)
    m = _SQLITE_UNIQUE.search(text)
    column = m.group(1) if m else None
    if column is None and (m := _PG_NAMED.search(text)) and "unique" in text:
        column = _constraint_columns().get(m.group(1))
    if column in _NOT_CHOSEN:
        column = None
    return f"{column}: already taken; choose another" if column else "conflicts with existing data; try again"


def _jsonable_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": e.get("type", "")}
            for e in exc.errors()]  # fmt: skip


def bootstrap(db: Database, settings: Settings) -> None:
    """Migrate, seed the price book, create the first admin from the environment: safe on every start."""
    migrate(db.engine)
    now = utcnow()
    with db.write() as s, s.begin():
        exclusive(s, BOOTSTRAP_LOCK)  # server processes starting together seed once
        prices.seed(s, settings.currency, now)
        if settings.admin_email and settings.admin_password:
            accounts.ensure_admin(s, settings.admin_email, settings.admin_password, now)
        registered = {c.name for c in inventory.clusters(s)}
        for preset in settings.virtual:
            if presets.preset_spec(preset)["name"] not in registered:
                inventory.register_preset(s, preset, now)


class App(FastAPI):
    """The server's app: the OpenAI gateway's `/v1/…` goes straight to its own ASGI app (`api.gateway_asgi`), ahead
    of the middleware stack that every other route passes; on an instance's own origin (`proxy_url`) it does not
    (that origin serves only its instance: `InstanceOrigins` answers 404)."""

    gateway: Gateway | None = None
    origins: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and self.gateway is not None and scope["path"].startswith(GATEWAY_PREFIX)
                and (self.origins is None or not self.origins.on_instance_host(scope))):  # fmt: skip
            scope["app"] = self
            await self.gateway(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, db: Database | None = None) -> FastAPI:
    db = db or Database(settings.db_url)
    srv = Server(settings, db, judge=HealthJudge(health.rules_of(settings)))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Route bodies are short database calls under the GIL: a few threads serve them as fast as forty,
        # without forty threads fighting over the GIL (which stretches the latency tail).
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
        bootstrap(db, settings)
        # Everything loaded so far (catalog, models, schemas) lives as long as the process: keep it out of the
        # cyclic collector's full passes, which would otherwise walk it and stall requests for tens of ms.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 50, 100)  # requests allocate many short-lived objects: collect young ones less often
        background = BackgroundProcess(settings) if settings.background else None
        if background:
            background.start()
        # The SSH gateway enters sandboxes of this host's local executor: it runs where the loops launch them.
        gateway = None
        if settings.background and settings.ssh_port:
            from suanli.control.workloads.ssh_gateway import GatewayProcess  # asyncssh: loaded only where it runs

            gateway = GatewayProcess(settings)
            gateway.start()
        app.state.background = background
        if settings.local_copy:
            from suanli.api.local_copy import LocalCopyServer

            try:
                app.state.local_copy = LocalCopyServer(srv)
            except OSError as e:  # no Unix socket to be had here: every copy goes over HTTP, the server still starts
                logging.getLogger("suanli.local_copy").warning("same-host copies are off: %s", e)
        try:
            yield
        finally:
            if getattr(app.state, "proxy", None) is not None:
                await app.state.proxy.aclose()
            if getattr(app.state, "gateway", None) is not None:
                await app.state.gateway.aclose()
            if getattr(app.state, "local_copy", None) is not None:
                app.state.local_copy.close()
            if gateway:
                gateway.stop()
            if background:
                background.stop()
            srv.submissions.close()
            srv.passwords.close()
            await db.aclose()
            db.dispose()

    app = App(
        title="suanli",
        version=__version__,
        description="Self-hosted GPU compute leasing: accounts, prepaid balances, offers, quotes and operations.",
        lifespan=lifespan,
        docs_url=None,  # served by the console from its vendored Swagger UI (no CDN): suanli.web.app
        redoc_url=None,
    )
    app.state.server = srv

    def gateway_state() -> GatewayState:
        if getattr(app.state, "gateway", None) is None:
            app.state.gateway = GatewayState(db)
        return app.state.gateway

    app.gateway = Gateway(gateway_state)

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        if exc.retry_after is not None:
            headers["Retry-After"] = str(exc.retry_after)
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)

    # A volume's tree nested deeper than a walk descends (a workload made it): refused naming the volume.
    @app.exception_handler(TooDeep)
    async def too_deep(_: Request, exc: TooDeep) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc), "errors": _jsonable_errors(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = _parse_failure(exc) if exc.status_code == 400 else str(exc.detail)
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    # Last line of defence: a value the services let through but the database refuses is the caller's input
    # (too long for a column, a duplicate name), not a server fault.
    @app.exception_handler(DataError)
    async def data_error(_: Request, exc: DataError) -> JSONResponse:
        return JSONResponse({"detail": f"a value does not fit the database: {_db_message(exc)}"}, status_code=422)

    @app.exception_handler(IntegrityError)
    async def integrity_error(_: Request, exc: IntegrityError) -> JSONResponse:
        log.info("%s: %s", type(exc).__name__, _db_message(exc))
        return JSONResponse({"detail": _conflict_message(exc)}, status_code=409)

    # The database cannot serve now (see `transient`: down, unreachable, a rolled-back deadlock, SQLite locked):
    # 503, try again. The cause goes to the log, not to the caller. Other errors (a missing table) stay 500s.
    @app.exception_handler(OperationalError)
    @app.exception_handler(DatabaseUnavailable)
    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        if not transient(exc):
            raise exc
        log.warning("%s %s: database unavailable: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": "the database is unavailable right now; try again"}, status_code=503,
                            headers={"Retry-After": "1"})  # fmt: skip

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__, "database": db.dialect}

    routers = (auth.router, passwords.router, orgs.router, members.router, plans.router, market.router, admin.router, workloads.router,
               telemetry.router, ssh.router, instances.router, workdirs.router, hub.router, volumes.router,
               volume_files.router, endpoints.router, reports.router, credit.router,
               serve_quotes.router, agent_tokens.router)  # fmt: skip
    for r in routers:
        app.include_router(r, prefix=API, responses=ERRORS, dependencies=[Depends(no_nul)])
    app.include_router(telemetry.metrics_router, responses=ERRORS)
    app.include_router(instances.pages)
    web.mount(app)
    # Every other route, /workloads too (its JSON is parsed whole), takes max_body_bytes.
    uploads = {f"{API}/workdirs": settings.max_upload_bytes, f"{API}/telemetry/samples": SAMPLES_BODY_BYTES}
    streamed = {VOLUME_STREAMS: settings.volume_max_bytes}  # a volume's own size bounds what it takes
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, uploads=uploads, streamed=streamed)
    if settings.proxy_url:
        from suanli.api.proxy_origins import InstanceOrigins

        app.add_middleware(InstanceOrigins, proxy_url=settings.proxy_url)
        app.origins = InstanceOrigins(app.router, proxy_url=settings.proxy_url)
    return app


def app_from_environment() -> FastAPI:
    """The app of one worker of a multi-process server (`suanli server --workers N`)."""
    return create_app(Settings.model_validate_json(os.environ[SETTINGS_ENV]))
