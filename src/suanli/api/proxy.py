"""Forwarding browser traffic to an instance's JupyterLab or ports: HTTP streamed both ways, and WebSockets.

The decisions (who, where) are `suanli.control.proxy`'s; this module moves bytes. Nothing is buffered: request
bodies stream up as they arrive, responses stream down chunk by chunk (`aiter_raw`, so compressed bodies pass
unchanged), and a browser that goes away closes the upstream request.

JupyterLab's socket is opened with O_PATH | O_NOFOLLOW and checked to be a socket, and connections go through
`/proc/self/fd/N`: a tenant who swaps the socket file for a symlink (to another tenant's socket, or a root
service's) cannot redirect the proxy. Socket paths of any length work the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from fastapi import Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from suanli.control import proxy
from suanli.control.errors import Forbidden, ServiceError
from suanli.db.engine import Database
from suanli.sandbox.listeners import host_listener, owned_listener

log = logging.getLogger("suanli.proxy")
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host"})  # fmt: skip
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
GRANT_TTL_S = 10.0  # a session, its membership and the workload's place are re-read this often
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 300.0  # long polls and slow notebooks; kernels talk over WebSockets
WS_MAX_MESSAGE = 64 << 20


class NotReady(ServiceError):
    """The instance runs but its service does not answer (yet): 503, try again."""

    status = 503


@dataclass
class _Socket:
    """An O_PATH descriptor of a JupyterLab socket and the client that connects through it."""

    fd: int
    inode: tuple[int, int]
    client: httpx.AsyncClient


@dataclass
class ProxyState:
    """The proxy's per-process caches: sessions and upstreams (briefly), and one HTTP client per upstream."""

    db: Database
    home: Path
    grants: dict[tuple[str, str], tuple[float, proxy.Grant]] = field(default_factory=dict)
    upstreams: dict[tuple[str, str], tuple[float, proxy.Upstream]] = field(default_factory=dict)
    sockets: dict[str, _Socket] = field(default_factory=dict)
    tcp: httpx.AsyncClient | None = None

    # ---- who and where ----------------------------------------------------------------------------------------
    async def grant(self, workload_id: str, secret: str | None, now: datetime) -> proxy.Grant:
        if not secret:
            raise Forbidden(
                "not signed in to this instance; open it with `suanli jupyter NAME` or `suanli open NAME PORT`"
            )
        key, mono = (workload_id, secret), time.monotonic()
        hit = self.grants.get(key)
        if hit is None or mono - hit[0] > GRANT_TTL_S:
            g = await run_in_threadpool(self._session, workload_id, secret, now)
            if len(self.grants) > 10_000:
                self.grants.clear()
            hit = self.grants[key] = (mono, g)
        if hit[1].expires_at < now:
            raise Forbidden("your session for this instance has expired; open it again")
        return hit[1]

    async def upstream(self, workload_id: str, target: str) -> proxy.Upstream:
        key, mono = (workload_id, target), time.monotonic()
        hit = self.upstreams.get(key)
        if hit is None or mono - hit[0] > GRANT_TTL_S / 5:
            up = await run_in_threadpool(self._upstream, workload_id, target)
            if len(self.upstreams) > 10_000:
                self.upstreams.clear()
            hit = self.upstreams[key] = (mono, up)
        return hit[1]

    def _session(self, workload_id: str, secret: str, now: datetime) -> proxy.Grant:
        with self.db.read() as s:
            return proxy.session(s, workload_id, secret, now)

    def _upstream(self, workload_id: str, target: str) -> proxy.Upstream:
        with self.db.read() as s:
            return proxy.upstream(s, self.home, workload_id, target)

    # ---- connections ------------------------------------------------------------------------------------------
    def _socket(self, up: proxy.Upstream) -> _Socket:
        """The client for JupyterLab's socket, reopened when the socket file was replaced (a restarted Lab)."""
        assert up.socket is not None
        try:
            st = os.lstat(up.socket)
        except OSError:
            raise NotReady(f"JupyterLab in {up.name} is not running yet") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise NotReady(f"JupyterLab in {up.name} is not running")  # a symlink or a file put in its place
        key = str(up.socket)
        have = self.sockets.get(key)
        if have is not None and have.inode == (st.st_dev, st.st_ino):
            return have
        fd = os.open(up.socket, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        fst = os.fstat(fd)
        if not stat.S_ISSOCK(fst.st_mode):
            os.close(fd)
            raise NotReady(f"JupyterLab in {up.name} is not running")
        transport = httpx.AsyncHTTPTransport(uds=f"/proc/self/fd/{fd}", verify=False)
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        sock = _Socket(fd, (fst.st_dev, fst.st_ino), httpx.AsyncClient(transport=transport, timeout=timeout))
        self.sockets[key] = sock
        if have is not None:
            asyncio.get_running_loop().create_task(_close_later(have))
        return sock

    async def _port_address(self, up: proxy.Upstream) -> str:
        assert up.port is not None
        if up.sandbox_file is None:
            addr = host_listener(up.port)
        else:
            addr = await run_in_threadpool(owned_listener, up.sandbox_file, up.port)
        if addr is None:
            raise NotReady(f"nothing of {up.name} listens on port {up.port} (on 127.0.0.1 or all addresses) yet")
        return addr

    async def client_and_url(self, up: proxy.Upstream, path: str) -> tuple[httpx.AsyncClient, str]:
        if up.socket is not None:
            return self._socket(up).client, f"http://jupyter{path}"
        addr = await self._port_address(up)
        if self.tcp is None:
            self.tcp = httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        host = f"[{addr}]" if ":" in addr else addr
        return self.tcp, f"http://{host}:{up.port}{path}"

    async def raw_socket(self, up: proxy.Upstream) -> socket.socket:
        """A connected socket to the upstream, for a WebSocket."""
        loop = asyncio.get_running_loop()
        if up.socket is not None:
            fd = self._socket(up).fd
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = f"/proc/self/fd/{fd}"
        else:
            addr = await self._port_address(up)
            sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
            target = (addr, up.port)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, target), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            sock.close()
            raise NotReady(f"{up.name} does not answer yet") from None
        return sock

    async def aclose(self) -> None:
        for sock in self.sockets.values():
            await _close_later(sock, delay=0)
        self.sockets.clear()
        if self.tcp is not None:
            await self.tcp.aclose()


async def _close_later(sock: _Socket, delay: float = 30.0) -> None:
    """Close a replaced socket's client once requests still using it are likely done."""
    await asyncio.sleep(delay)
    await sock.client.aclose()
    with contextlib.suppress(OSError):
        os.close(sock.fd)


# ---- headers ------------------------------------------------------------------------------------------------------
def strip_cookie(header: str) -> str:
    """The Cookie header without the proxy's own session cookie: the instance never sees it."""
    jar: SimpleCookie = SimpleCookie()
    with contextlib.suppress(Exception):
        jar.load(header)
    if proxy.COOKIE not in jar:
        return header
    parts = [p.strip() for p in header.split(";")]
    return "; ".join(p for p in parts if p and p.split("=", 1)[0].strip() != proxy.COOKIE)


def cross_site(headers: Any, method: str) -> bool:
    """A state-changing request another site made the browser send (the session cookie is SameSite=Strict, so
    this is defence in depth), or a WebSocket opened from another origin."""
    site = headers.get("sec-fetch-site")
    if method not in SAFE_METHODS and site not in (None, "same-origin", "none"):
        return True
    origin = headers.get("origin")
    if origin and method not in SAFE_METHODS:
        return urlsplit(origin).netloc.lower() != (headers.get("host") or "").lower()
    return False


def upstream_headers(request_headers: Any, up: proxy.Upstream, client: str, scheme: str, prefix: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in request_headers.items():
        lk = k.lower()
        if lk in HOP_BY_HOP or lk.startswith("sec-websocket") or (lk == "authorization" and up.socket is not None):
            continue
        out[lk] = strip_cookie(v) if lk == "cookie" else v
    out["host"] = request_headers.get("host", "localhost")
    if up.socket is not None:
        out["authorization"] = f"token {up.token}"
    out["x-forwarded-for"] = client
    out["x-forwarded-proto"] = scheme
    out["x-forwarded-host"] = out["host"]
    out["x-forwarded-prefix"] = prefix
    return out


def downstream_headers(headers: httpx.Headers, prefix: str, rewrite_location: bool) -> list[tuple[bytes, bytes]]:
    out = []
    for k, v in headers.multi_items():
        lk = k.lower()
        if lk in HOP_BY_HOP:
            continue
        if lk == "location" and rewrite_location and v.startswith("/") and not v.startswith("//"):
            v = prefix + v  # a service at / that redirects to /x means /i/<id>/port/N/x
        out.append((lk.encode("latin-1"), v.encode("latin-1")))
    return out


# ---- HTTP ---------------------------------------------------------------------------------------------------------
async def forward_http(state: ProxyState, request: Request, up: proxy.Upstream, path: str, prefix: str) -> Response:
    if cross_site(request.headers, request.method):
        raise Forbidden("cross-site request refused")
    client, url = await state.client_and_url(up, path)
    if request.url.query:
        url += "?" + request.url.query
    headers = upstream_headers(request.headers, up, request.client.host if request.client else "", request.url.scheme,
                               prefix)  # fmt: skip
    body: AsyncIterator[bytes] | None = None if request.method in ("GET", "HEAD") else request.stream()
    req = client.build_request(request.method, url, headers=headers, content=body)
    try:
        resp = await client.send(req, stream=True)
    except httpx.ConnectError:
        state.upstreams.clear()
        raise NotReady(f"{up.name} does not answer yet") from None
    except httpx.TimeoutException:
        raise NotReady(f"{up.name} did not answer in time") from None
    return _streamed(resp, prefix, rewrite_location=up.socket is None)


def _streamed(resp: httpx.Response, prefix: str, rewrite_location: bool) -> Response:
    out = StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, background=BackgroundTask(resp.aclose))
    out.raw_headers = downstream_headers(resp.headers, prefix, rewrite_location)
    return out


# ---- WebSockets ---------------------------------------------------------------------------------------------------
async def forward_ws(state: ProxyState, ws: WebSocket, up: proxy.Upstream, path: str, prefix: str) -> None:
    """Connect upstream first (offering the browser's subprotocols), then accept the browser with the one chosen,
    and copy messages both ways until either side closes."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidHandshake

    if cross_site(ws.headers, "WEBSOCKET"):
        await ws.close(code=1008)
        return
    try:
        sock = await state.raw_socket(up)
    except ServiceError:
        await ws.close(code=1013)
        return
    query = ("?" + ws.url.query) if ws.url.query else ""
    headers = upstream_headers(ws.headers, up, ws.client.host if ws.client else "", ws.url.scheme, prefix)
    headers.pop("host", None)
    headers.pop("origin", None)
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    host = ws.headers.get("host", "localhost")
    try:
        upstream = await connect(f"ws://{host}{path}{query}", sock=sock, additional_headers=headers,
                                 origin=ws.headers.get("origin"), subprotocols=offered or None,  # type: ignore[arg-type]
                                 max_size=WS_MAX_MESSAGE, compression=None, open_timeout=CONNECT_TIMEOUT_S,
                                 user_agent_header=None, ping_interval=None)  # fmt: skip
    except (OSError, InvalidHandshake, TimeoutError) as e:
        log.info("proxy: websocket to %s refused: %s", up.name, e)
        sock.close()
        await ws.close(code=1011)
        return
    await ws.accept(subprotocol=upstream.subprotocol)

    async def down() -> None:
        async for msg in upstream:
            if isinstance(msg, bytes):
                await ws.send_bytes(msg)
            else:
                await ws.send_text(msg)

    async def up_() -> None:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            if msg.get("bytes") is not None:
                await upstream.send(msg["bytes"])
            elif msg.get("text") is not None:
                await upstream.send(msg["text"])

    tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(up_())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except (ConnectionClosed, OSError):
        pass
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        await upstream.close()
        with contextlib.suppress(Exception):
            await ws.close()
