"""The FastAPI application: routers under /api/v1, errors as JSON with a message, and the server's lifecycle
(migrate on start, seed prices and the first admin, run the background loops)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from suanli import __version__
from suanli.api.deps import Server
from suanli.api.routers import admin, auth, market, orgs
from suanli.control import accounts, prices
from suanli.control.background import MeteringLoop
from suanli.control.errors import ServiceError
from suanli.control.ids import utcnow
from suanli.control.offers import OfferCache
from suanli.control.settings import Settings
from suanli.db.engine import Database
from suanli.db.migrate import migrate

API = "/api/v1"


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413, whether or not they declare a length."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await _too_large(self.limit, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _too_large(self.limit, send)


class _TooLarge(Exception):
    pass


async def _too_large(limit: int, send: Send) -> None:
    resp = JSONResponse({"detail": f"request body larger than {limit} bytes"}, status_code=413)
    await resp({"type": "http"}, _nothing, send)


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _jsonable_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": e.get("type", "")}
            for e in exc.errors()]  # fmt: skip


def bootstrap(db: Database, settings: Settings) -> None:
    """Migrate, seed the price book, create the first admin from the environment: safe on every start."""
    migrate(db.engine)
    now = utcnow()
    with db.write() as s, s.begin():
        prices.seed(s, settings.currency, now)
        if settings.admin_email and settings.admin_password:
            accounts.ensure_admin(s, settings.admin_email, settings.admin_password, now)


def create_app(settings: Settings, db: Database | None = None) -> FastAPI:
    db = db or Database(settings.db_url)
    srv = Server(settings, db, OfferCache())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bootstrap(db, settings)
        loop = MeteringLoop(db, settings) if settings.background else None
        if loop:
            loop.start()
        app.state.metering = loop
        try:
            yield
        finally:
            if loop:
                loop.stop()
            db.dispose()

    app = FastAPI(
        title="suanli",
        version=__version__,
        description="Self-hosted GPU compute leasing: accounts, prepaid balances, offers, quotes and operations.",
        lifespan=lifespan,
    )
    app.state.server = srv

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc), "errors": _jsonable_errors(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__, "database": db.dialect}

    for r in (auth.router, orgs.router, market.router, admin.router):
        app.include_router(r, prefix=API)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app
