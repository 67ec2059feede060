"""Forwarding browser traffic to an instance's JupyterLab or ports: HTTP streamed both ways, and WebSockets.

The decisions (who, where) are `suanli.control.workloads.proxy`'s; this module moves bytes. Nothing is buffered: request
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
import re
import socket
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from fastapi import Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from suanli.api import proxy_netns
from suanli.api.proxy_headers import BadGateway, cross_site, downstream_headers, raw_target, upstream_headers
from suanli.control.errors import Forbidden, ServiceError
from suanli.control.ids import utcnow
from suanli.control.workloads import proxy
from suanli.db.engine import Database
from suanli.sandbox.listeners import host_listener, owned_listener
from suanli.sandbox.ns_socket import own_network

log = logging.getLogger("suanli.proxy")
GRANT_TTL_S = 10.0  # a session, its membership and the workload's place are re-read this often
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 300.0  # long polls and slow notebooks; kernels talk over WebSockets
WS_MAX_MESSAGE = 16 << 20  # one message; with a queue of one, a WebSocket pins at most ~2 of these
MAX_WS_PER_USER = 64  # open WebSockets of one user through one server process
_AUTHORITY = re.compile(r"(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::([0-9]{1,5}))?")  # a Host header


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
    open_ws: dict[str, int] = field(default_factory=dict)  # user -> WebSockets open now
    tcp: httpx.AsyncClient | None = None
    netns: dict[str, httpx.AsyncClient] = field(default_factory=dict)  # sandbox record -> client into its network

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

    async def client_and_url(
        self, up: proxy.Upstream, raw_path: bytes, query: bytes
    ) -> tuple[httpx.AsyncClient, httpx.URL]:
        """The client and the URL of one request upstream. The URL is built from parts, never by pasting text: the
        port is the one checked, whatever the path holds."""
        if up.socket is not None:
            return self._socket(up).client, httpx.URL(
                scheme="http", host="jupyter", raw_path=raw_target(raw_path, query)
            )
        addr = await self._port_address(up)
        if up.sandbox_file is not None and await run_in_threadpool(own_network, up.sandbox_file):
            return self._netns_client(up.sandbox_file), httpx.URL(
                scheme="http", host=addr, port=up.port, raw_path=raw_target(raw_path, query)
            )
        if self.tcp is None:
            # No keep-alive: a pooled connection would outlive the check that its listener is this workload's
            # (a tenant closes the listener, keeps the accepted connection, and the next owner of the port's
            # requests would go down it).
            self.tcp = httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                                         limits=httpx.Limits(max_keepalive_connections=0))  # fmt: skip
        return self.tcp, httpx.URL(scheme="http", host=addr, port=up.port, raw_path=raw_target(raw_path, query))

    def _netns_client(self, sandbox_file: Path) -> httpx.AsyncClient:
        """The client whose connections are made in a `network: private` sandbox's namespace (`api.proxy_netns`)."""
        key = str(sandbox_file)
        if key not in self.netns:
            if len(self.netns) > 1000:  # records of ended attempts: their clients hold no connection (no keep-alive)
                old = list(self.netns.values())
                self.netns.clear()
                asyncio.get_running_loop().create_task(proxy_netns.close_all(old))
            timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
            self.netns[key] = proxy_netns.client_into(sandbox_file, timeout)
        return self.netns[key]

    def recheck(self, up: proxy.Upstream) -> dict[str, Any]:
        """Request extensions that check a port's listener again once connected, before a byte goes out: the
        tenant's process may let go of the port between the check and the connect, and somebody else's service (a
        restarting replica, another tenant's) take it. Then that connection is closed and the request refused."""
        if up.socket is not None:
            return {}

        async def trace(event: str, info: dict[str, Any]) -> None:
            if event == "connection.connect_tcp.complete":
                try:
                    await self._port_address(up)
                except NotReady:
                    await info["return_value"].aclose()
                    raise

        return {"trace": trace}

    async def raw_socket(self, up: proxy.Upstream) -> socket.socket:
        """A connected socket to the upstream, for a WebSocket."""
        loop = asyncio.get_running_loop()
        if up.socket is not None:
            fd = self._socket(up).fd
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = f"/proc/self/fd/{fd}"
        else:
            addr = await self._port_address(up)
            if up.sandbox_file is not None and await run_in_threadpool(own_network, up.sandbox_file):
                try:  # a `network: private` sandbox: the socket is made in its namespace
                    sock = await proxy_netns.connect(up.sandbox_file, addr, up.port or 0, CONNECT_TIMEOUT_S)
                except (OSError, TimeoutError):
                    raise NotReady(f"{up.name} does not answer yet") from None
                return await self._rechecked(up, sock)
            sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
            target = (addr, up.port)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, target), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            sock.close()
            raise NotReady(f"{up.name} does not answer yet") from None
        return await self._rechecked(up, sock) if up.socket is None else sock

    async def _rechecked(self, up: proxy.Upstream, sock: socket.socket) -> socket.socket:
        try:  # connected to the listener checked, or to whoever took its port since (see `recheck`)
            await self._port_address(up)
        except NotReady:
            sock.close()
            raise
        return sock

    async def aclose(self) -> None:
        for sock in self.sockets.values():
            await _close_later(sock, delay=0)
        self.sockets.clear()
        if self.tcp is not None:
            await self.tcp.aclose()
        for client in self.netns.values():
            await client.aclose()
        self.netns.clear()


async def _close_later(sock: _Socket, delay: float = 30.0) -> None:
    """Close a replaced socket's client once requests still using it are likely done."""
    await asyncio.sleep(delay)
    await sock.client.aclose()
    with contextlib.suppress(OSError):
        os.close(sock.fd)


# ---- HTTP ---------------------------------------------------------------------------------------------------------
async def forward_http(
    state: ProxyState, request: Request, up: proxy.Upstream, raw_path: bytes, prefix: str, scope: str
) -> Response:
    if cross_site(request.headers, request.method):
        raise Forbidden("cross-site request refused")
    if request.headers.get("service-worker") == "script":
        # A service worker registered from an instance's page would control every page of this origin.
        raise Forbidden("service workers are not allowed on instance pages")
    client, url = await state.client_and_url(up, raw_path, request.scope.get("query_string", b""))
    has_body = request.method not in ("GET", "HEAD", "OPTIONS") or "content-length" in request.headers
    headers = upstream_headers(request.headers, up, request.client.host if request.client else "", request.url.scheme,
                               prefix, has_body)  # fmt: skip
    body: AsyncIterator[bytes] | None = request.stream() if has_body else None
    req = client.build_request(request.method, url, headers=headers, content=body, extensions=state.recheck(up))
    try:
        resp = await client.send(req, stream=True)
    except httpx.ConnectError:
        state.upstreams.clear()
        raise NotReady(f"{up.name} does not answer yet") from None
    except httpx.TimeoutException:
        raise NotReady(f"{up.name} did not answer in time") from None
    except httpx.TransportError as e:  # it hung up, or spoke something that is not HTTP
        raise BadGateway(f"{up.name} broke off: {type(e).__name__}") from None
    except (httpx.HTTPError, httpx.InvalidURL) as e:  # an answer httpx cannot take (a Location it cannot parse)
        raise BadGateway(f"{up.name} answered what cannot be relayed: {type(e).__name__}") from None
    try:
        raw = downstream_headers(resp.headers, prefix, scope, request.headers.get("host", ""), up.socket is None)
    except BaseException:  # whatever refused it, its connection goes back: kept, it would hold a descriptor for ever
        await resp.aclose()
        raise
    out = StreamingResponse(_relay(resp), status_code=resp.status_code, background=BackgroundTask(resp.aclose))
    out.raw_headers = raw
    return out


async def _relay(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The body as it comes; a service that breaks off mid-body ends the response (the browser sees it cut)."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except httpx.TransportError as e:
        log.info("proxy: upstream broke off mid-body: %s", e)


# ---- WebSockets ---------------------------------------------------------------------------------------------------
def _authority(host: str) -> bool:
    """A Host header fit to put in a URI: a name or bracketed IPv6 address, and a port that exists."""
    m = _AUTHORITY.fullmatch(host)
    return m is not None and (m.group(1) is None or int(m.group(1)) <= 65535)


async def forward_ws(
    state: ProxyState, ws: WebSocket, up: proxy.Upstream, raw_path: bytes, prefix: str, grant: proxy.Grant,
    secret: str,
) -> None:  # fmt: skip
    """Connect upstream first (offering the browser's subprotocols), then accept the browser with the one chosen,
    and copy messages both ways until either side closes, or the session ends (its user left the org, it
    expired, the instance stopped): re-checked as often as HTTP requests are. One user holds at most
    `MAX_WS_PER_USER` through one process, counted from before the first await."""
    host = ws.headers.get("host", "localhost")
    if cross_site(ws.headers, "WEBSOCKET") or not _authority(host):  # the host goes into the upstream URI
        await ws.close(code=1008)
        return
    if state.open_ws.get(grant.user_id, 0) >= MAX_WS_PER_USER:
        await ws.close(code=1013)
        return
    state.open_ws[grant.user_id] = state.open_ws.get(grant.user_id, 0) + 1  # counted before the first await: opens
    try:  # at once count too
        await _bridge(state, ws, up, raw_path, prefix, grant, secret, host)
    finally:
        state.open_ws[grant.user_id] -= 1


async def _bridge(
    state: ProxyState, ws: WebSocket, up: proxy.Upstream, raw_path: bytes, prefix: str, grant: proxy.Grant,
    secret: str, host: str,
) -> None:  # fmt: skip
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    try:
        sock = await state.raw_socket(up)
    except ServiceError:
        await ws.close(code=1013)
        return
    headers = upstream_headers(ws.headers, up, ws.client.host if ws.client else "", ws.url.scheme, prefix, False)
    headers.pop("host", None)
    headers.pop("origin", None)
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    uri = f"ws://{host}{raw_target(raw_path, ws.scope.get('query_string', b'')).decode('latin-1')}"
    try:
        upstream = await connect(uri, sock=sock, additional_headers=headers, origin=ws.headers.get("origin"),  # type: ignore[arg-type]
                                 subprotocols=offered or None, max_size=WS_MAX_MESSAGE, max_queue=1,  # type: ignore[arg-type]
                                 compression=None, open_timeout=CONNECT_TIMEOUT_S, user_agent_header=None,
                                 ping_interval=None)  # fmt: skip
    except Exception as e:  # refused, timed out, or a handshake or URI it would not take: the socket is ours to close
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

    async def watch() -> None:
        while True:
            await asyncio.sleep(GRANT_TTL_S)
            try:
                await state.grant(grant.workload_id, secret, utcnow())
                await state.upstream(grant.workload_id, "lab" if up.socket is not None else f"port:{up.port}")
            except ServiceError:
                return

    tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(up_()), asyncio.ensure_future(watch())]
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
            await ws.close(code=1008)
