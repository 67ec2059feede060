"""Opening an instance in a browser: JupyterLab at `/i/<id>/lab/` and a workload's ports at `/i/<id>/port/<N>/`.

`POST /api/v1/workloads/{ref}/proxy` (bearer token) gives a one-minute, single-use link; `/i/<id>/auth` trades it
for an HttpOnly session cookie scoped to that instance and sends the browser on. Everything under `/i/<id>/` is
then forwarded, HTTP and WebSocket, by `suanli.api.proxy` to the instance's sandbox on this host.
"""

from __future__ import annotations

import html
import re
from datetime import datetime

from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import Field
from starlette.responses import Response

from suanli.api.deps import Auth, in_thread
from suanli.api.proxy import NotReady, ProxyState, forward_http, forward_ws
from suanli.api.schemas import In, Out
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.accounts import accounts
from suanli.control.errors import NotFound, ServiceError
from suanli.control.ids import utcnow
from suanli.control.workloads import proxy
from suanli.workloads.models import PORT_RANGE

router = APIRouter(route_class=StrictJSONRoute, tags=["instances"])  # under /api/v1
pages = APIRouter(route_class=StrictJSONRoute, include_in_schema=False)  # under /: the browser's side
WORKLOAD_ID = re.compile(r"wl_[0-9a-f]{16}")
PORT_TEXT = re.compile(r"[1-9][0-9]{0,4}")
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class ProxyIn(In):
    port: int | None = Field(None, ge=PORT_RANGE[0], le=PORT_RANGE[1], description="one of the workload's `ports`; "
                             "none: its JupyterLab (started now if the instance was not started with it)")  # fmt: skip


class ProxyOut(Out):
    url: str = Field(
        description="a path on this server (or a URL on the instance's own origin, when the server has a "
        "proxy_url), to open in a browser within a minute; it works once"
    )
    expires_at: datetime
    target: str
    started_jupyter: bool = False


@router.post("/workloads/{ref}/proxy")
@in_thread
def open_proxy(ref: str, ctx: Auth, body: ProxyIn = ProxyIn()) -> ProxyOut:
    """A single-use link into a running workload's JupyterLab (instances) or one of its `ports`, for a member of
    its org. The link leads to a session cookie for that instance; the API token never goes into a URL."""
    with ctx.db.write() as s, s.begin():
        accounts.check_live(s, ctx.who)
        w, ticket, target, expires = proxy.open_ticket(s, ctx.who, ref, body.port, ctx.now)
    started = proxy.ensure_jupyter(ctx.srv.settings.home, w) if target == "lab" else False
    origin = proxy.origin_of(ctx.srv.settings.proxy_url, w.id)
    return ProxyOut(url=f"{origin}/i/{w.id}/auth?ticket={ticket}", target=target, started_jupyter=started,
                    expires_at=expires)  # fmt: skip


def _state(request: Request | WebSocket) -> ProxyState:
    app = request.app
    if getattr(app.state, "proxy", None) is None:
        srv = app.state.server
        app.state.proxy = ProxyState(srv.db, srv.settings.home)
    return app.state.proxy


def _workload_id(wid: str) -> str:
    if not WORKLOAD_ID.fullmatch(wid):
        raise NotFound("no such instance")
    return wid


def _where(target: str, wid: str) -> str:
    return f"/i/{wid}/lab/" if target == "lab" else f"/i/{wid}/port/{target.split(':', 1)[1]}/"


@pages.get("/i/{wid}/auth")
async def auth(wid: str, request: Request, ticket: str = Query(..., min_length=16, max_length=128)) -> Response:
    """Trade a ticket for the session cookie, then go on with a same-site navigation (a page that refreshes, not a
    redirect) so the SameSite=Strict cookie is sent from the first request on. A link another site makes the
    browser follow is refused: it would sign the browser in to somebody else's instance."""
    wid = _workload_id(wid)
    if request.headers.get("sec-fetch-site") == "cross-site":
        return _page(403, "this link must be opened directly (paste it into the address bar), not from another site")
    secret, target, ends = await run_in_threadpool(_redeem, request, wid, ticket)
    where = _where(target, wid)
    page = HTMLResponse(
        f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(where)}">'
        f'<title>Opening…</title><p>Opening <a href="{html.escape(where)}">{html.escape(where)}</a>…</p>',
        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
    )
    page.set_cookie(proxy.COOKIE, secret, max_age=int((ends - utcnow()).total_seconds()), path=f"/i/{wid}/",
                    httponly=True, samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
    return page


def _page(status: int, message: str, **headers: str) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><title>suanli</title><p>{html.escape(message)}</p>", status_code=status,
                        headers={"Cache-Control": "no-store", **headers})  # fmt: skip


def _redeem(request: Request, wid: str, ticket: str) -> tuple[str, str, datetime]:
    db = request.app.state.server.db
    with db.write() as s, s.begin():
        return proxy.redeem(s, wid, ticket, utcnow())


async def _refused(e: ServiceError, request: Request) -> Response:
    if isinstance(e, NotReady):  # a browser waiting for JupyterLab to come up: a page that tries again
        home = request.app.state.server.settings.home
        wid = request.path_params.get("wid", "")
        lab = request.url.path.startswith(f"/i/{wid}/lab")
        detail = await run_in_threadpool(proxy.jupyter_log, home, wid) if lab and WORKLOAD_ID.fullmatch(wid) else ""
        body = f"<p>{html.escape(e.message)}; this page tries again in 2 s.</p>"
        if detail:
            body += f"<pre>{html.escape(detail)}</pre>"
        return HTMLResponse(f'<!doctype html><meta http-equiv="refresh" content="2"><title>Starting…</title>{body}',
                            status_code=503, headers={"Retry-After": "2", "Cache-Control": "no-store"})  # fmt: skip
    return _page(e.status, e.message)


def _port(port: str) -> int:
    """A port as written in the URL: canonical digits only (`04444` is not 4444), within the spec's range."""
    if not PORT_TEXT.fullmatch(port) or not PORT_RANGE[0] <= int(port) <= PORT_RANGE[1]:
        raise NotFound("no such port")
    return int(port)


def _tail(request: Request | WebSocket, prefix: str) -> bytes:
    """The raw path after `prefix` (percent-escapes kept as sent), '/' at least."""
    raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
    head = prefix.encode()
    return raw[len(head) :] if raw.startswith(head) else b"/"


async def _forward(request: Request, wid: str, target: str, raw_path: bytes, prefix: str, scope: str) -> Response:
    state = _state(request)
    try:
        wid = _workload_id(wid)
        await state.grant(wid, request.cookies.get(proxy.COOKIE), utcnow())
        up = await state.upstream(wid, target)
        return await forward_http(state, request, up, raw_path, prefix, scope)
    except ServiceError as e:
        return await _refused(e, request)


@pages.api_route("/i/{wid}/lab", methods=["GET", "HEAD"])
async def lab_root(wid: str) -> Response:
    return RedirectResponse(f"/i/{_workload_id(wid)}/lab/", status_code=307)


@pages.api_route("/i/{wid}/lab/{path:path}", methods=METHODS)
async def lab(wid: str, path: str, request: Request) -> Response:
    # JupyterLab serves under its base_url, the whole path: nothing is stripped.
    raw = request.scope.get("raw_path") or request.url.path.encode()
    return await _forward(request, wid, "lab", raw, "", f"/i/{wid}/lab/")


@pages.api_route("/i/{wid}/port/{port}", methods=["GET", "HEAD"])
async def port_root(wid: str, port: str) -> Response:
    return RedirectResponse(f"/i/{_workload_id(wid)}/port/{_port(port)}/", status_code=307)


@pages.api_route("/i/{wid}/port/{port}/{path:path}", methods=METHODS)
async def port(wid: str, port: str, path: str, request: Request) -> Response:
    # A service at a port expects to be at `/`: the prefix goes, and X-Forwarded-Prefix says what it was.
    try:
        n = _port(port)
    except ServiceError as e:
        return await _refused(e, request)
    prefix = f"/i/{wid}/port/{n}"
    return await _forward(request, wid, f"port:{n}", _tail(request, prefix), prefix, prefix + "/")


async def _ws(ws: WebSocket, wid: str, target: str, raw_path: bytes, prefix: str) -> None:
    state = _state(ws)
    secret = ws.cookies.get(proxy.COOKIE)
    try:
        wid = _workload_id(wid)
        grant = await state.grant(wid, secret, utcnow())
        up = await state.upstream(wid, target)
    except ServiceError:
        await ws.close(code=1008)  # before accepting: the browser sees the handshake refused (403)
        return
    assert secret is not None
    await forward_ws(state, ws, up, raw_path, prefix, grant, secret)


@pages.websocket("/i/{wid}/lab/{path:path}")
async def lab_ws(ws: WebSocket, wid: str, path: str) -> None:
    await _ws(ws, wid, "lab", ws.scope.get("raw_path") or ws.url.path.encode(), "")


@pages.websocket("/i/{wid}/port/{port}/{path:path}")
async def port_ws(ws: WebSocket, wid: str, port: str, path: str) -> None:
    try:
        n = _port(port)
    except ServiceError:
        await ws.close(code=1008)
        return
    prefix = f"/i/{wid}/port/{n}"
    await _ws(ws, wid, f"port:{n}", _tail(ws, prefix), prefix)
