"""What a tenant's own service can do to the instance proxy: answer with headers, redirects and handshakes made to
break it. Found by a hostile review; each was an attack before its fix (docs/jupyter-and-ports.md).

The proxy's routes run with the production forwarding code (`suanli.api.proxy`) against real loopback services
(raw sockets, a websockets echo server, uvicorn where concurrency matters); only who is signed in and which sandbox
holds the port are faked, as in tests/test_proxy_attacks.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from suanli.api import proxy as api_proxy
from suanli.control.workloads import proxy
from tests.test_proxy_attacks import proxy_app

WID = "wl_00000000000000aa"
COOKIES = {proxy.COOKIE: "s" * 43}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Echo:
    """A websockets echo server on 127.0.0.1 in a thread of its own, answering handshakes after `delay` s."""

    def __init__(self, delay: float = 0.0) -> None:
        self.port = _free_port()
        self.delay = delay
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Future[None] | None = None
        threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True).start()
        assert self.ready.wait(10)

    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        async def echo(ws: Any) -> None:
            with contextlib.suppress(Exception):
                async for m in ws:
                    await ws.send(m)

        async def slow(conn: Any, request: Any) -> None:
            await asyncio.sleep(self.delay)

        self.loop = asyncio.get_running_loop()
        self.stop = self.loop.create_future()
        async with serve(echo, "127.0.0.1", self.port, process_request=slow, ping_interval=None, backlog=512):
            self.ready.set()
            await self.stop

    def close(self) -> None:
        if self.loop is not None and self.stop is not None:
            self.loop.call_soon_threadsafe(lambda: self.stop.done() or self.stop.set_result(None))  # type: ignore[union-attr]


def _app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tcp: httpx.AsyncClient | None = None) -> FastAPI:
    return proxy_app(tmp_path, monkeypatch, "usr_mallory", tcp)


@pytest.fixture
def echo() -> Iterator[_Echo]:
    e = _Echo()
    yield e
    e.close()


def _raw_server(answer: bytes) -> tuple[socket.socket, int]:
    """A listener that answers every request with `answer` (bytes on the wire) and hangs up: the only descriptors
    left open afterwards are the proxy's own."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(512)

    def serve() -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            with contextlib.suppress(OSError):
                c.recv(65536)
                c.sendall(answer)
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    return ls, ls.getsockname()[1]


def _serve(app: FastAPI) -> tuple[uvicorn.Server, threading.Thread, int]:
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="websockets-sansio")
    )
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return server, t, port


def _browser_target(location: str, base: str) -> str:
    """Where a browser goes for `Location: location` on page `base` (WHATWG URL parsing, the parts that matter:
    tab and newline removed, backslash is a slash in http(s) URLs, `scheme:host` with another special scheme than
    the base's is absolute)."""
    v = location.strip(" \x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f").replace("\t", "").replace("\n", "")
    v = v.replace("\r", "")
    scheme, sep, rest = v.partition(":")
    if sep and scheme.lower() in ("http", "https") and "/" not in scheme and "\\" not in scheme:
        if scheme.lower() != urlsplit(base).scheme:
            host = rest.lstrip("/\\")
            return f"{scheme.lower()}://{host}"
        v = rest
    v = v.replace("\\", "/")
    return urljoin(base, v)


# ---- HTTP ---------------------------------------------------------------------------------------------------------
UTF8_ANSWER = b"HTTP/1.1 200 OK\r\nX-Name: \xe4\xb8\xad\xe6\x96\x87\r\nContent-Length: 2\r\n\r\nok"


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_header_in_utf8_is_relayed_as_it_came_and_leaks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header value in UTF-8 (`X-Name: 中文`) was decoded by httpx and re-encoded as latin-1, which raised: an
    unhandled error (a 500) that left the upstream connection checked out of the shared pool with its socket open,
    for good. 200 such answers kept 200 descriptors. Now the bytes pass as they came, and any refusal of an answer's
    headers closes its connection."""
    listener, port = _raw_server(UTF8_ANSWER)
    app = _app(tmp_path, monkeypatch)
    state = app.state.proxy

    async def go() -> tuple[httpx.Response, int, int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                     cookies=COOKIES, timeout=None) as c:  # fmt: skip
            first = await c.get(f"/i/{WID}/port/{port}/")
            gc.collect()
            before = _fds()
            for _ in range(200):
                await asyncio.wait_for(c.get(f"/i/{WID}/port/{port}/"), 10)
            await asyncio.sleep(0.5)
            gc.collect()
            after, in_use = _fds(), len(state.tcp._transport._pool.connections)
            await state.tcp.aclose()
            return first, before, after, in_use

    try:
        first, before, after, in_use = asyncio.run(go())
    finally:
        listener.close()
    assert first.status_code == 200 and first.content == b"ok"
    assert ("x-name", "中文".encode()) in [(k.decode(), v) for k, v in first.headers.raw]
    assert after - before < 20 and in_use < 20, (after - before, in_use)


def test_an_answer_refused_for_its_headers_closes_its_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redirect off the server is a 502; its upstream connection is closed, not kept out of the pool."""
    listener, port = _raw_server(b"HTTP/1.1 302 Found\r\nLocation: https://evil.example/\r\nContent-Length: 0\r\n\r\n")
    app = _app(tmp_path, monkeypatch)
    state = app.state.proxy

    async def go() -> tuple[list[int], int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                     cookies=COOKIES, timeout=None) as c:  # fmt: skip
            codes = [(await c.get(f"/i/{WID}/port/{port}/")).status_code for _ in range(50)]
            in_use = len(state.tcp._transport._pool.connections)
            await state.tcp.aclose()
            return codes, in_use

    try:
        codes, in_use = asyncio.run(go())
    finally:
        listener.close()
    assert set(codes) == {502} and in_use < 5, (set(codes), in_use)


@pytest.mark.parametrize(
    "location",
    ["\\\\evil.example/x", "\\/evil.example/x", "https:/\\evil.example/x", "https:evil.example/x", "/\\evil.example",
     " //evil.example/", "\t//evil.example/", "javascript:alert(1)", "https://testserver.evil.example/"],
)  # fmt: skip
def test_a_redirect_off_the_server_is_refused_in_every_spelling_a_browser_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str
) -> None:
    """Browsers read `\\` as `/` in http(s) URLs, drop spaces and control characters around a URL, and take
    `https:evil.example` on an http page as absolute; the check read URLs as urlsplit does, and
    `Location: \\\\evil.example/x` sent the browser off the console's own address (a phishing link). Each is a 502,
    and the proxy does not fail on what httpx itself cannot parse (`https:evil.example/x` was a 500)."""
    app = _app(tmp_path, monkeypatch, tcp=httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: httpx.Response(302, headers={"location": location}))))  # fmt: skip
    client = TestClient(app, raise_server_exceptions=True, cookies=COOKIES)
    page = f"http://testserver/i/{WID}/port/4444/go"
    r = client.get(page, follow_redirects=False)
    assert r.status_code == 502, (r.status_code, r.headers.get("location"))
    if "location" in r.headers:  # (never: but were it sent, it must land here)
        assert urlsplit(_browser_target(r.headers["location"], page)).netloc == "testserver"


@pytest.mark.parametrize("location", ["/lab/tree", "tree?x=1", "http://testserver/other", "../up"])
def test_redirects_that_stay_on_the_server_still_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str
) -> None:
    listener, port = _raw_server(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())
    app = _app(tmp_path, monkeypatch)
    client = TestClient(app, raise_server_exceptions=True, cookies=COOKIES)
    page = f"http://testserver/i/{WID}/port/{port}/go"
    try:
        r = client.get(page, follow_redirects=False)
    finally:
        listener.close()
    assert r.status_code == 302, r.status_code
    assert urlsplit(_browser_target(r.headers["location"], page)).netloc == "testserver"


# ---- WebSockets ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["x:abc", "[::1", "u@h", "h:99999", "a b"])
def test_a_hostile_host_header_on_a_websocket_is_refused_before_anything_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, echo: _Echo, host: str
) -> None:
    """The browser's Host goes into the upstream URI (JupyterLab compares it with the Origin). `x:abc`, `[::1`,
    `h:99999` and `u@h` made websockets raise after the upstream socket was connected: an unhandled error, and the
    socket left to the garbage collector. Now the Host is checked first and the WebSocket closed (1008)."""
    app = _app(tmp_path, monkeypatch)
    client = TestClient(app, raise_server_exceptions=True, cookies=COOKIES)
    url = f"/i/{WID}/port/{echo.port}/"
    with client.websocket_connect(url) as ws:
        ws.send_text("hi")
        assert ws.receive_text() == "hi"
    with pytest.raises(WebSocketDisconnect) as e, client.websocket_connect(url, headers={"host": host}) as ws:
        ws.receive_text()
    assert e.value.code == 1008
    assert app.state.proxy.open_ws.get("usr_mallory", 0) == 0


def test_the_per_user_websocket_cap_holds_when_they_open_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`MAX_WS_PER_USER` was checked before the upstream handshake and counted after it: a service that delays its
    handshake by 1 s let one user open 200 WebSockets at once (each can pin about 2 x 16 MiB). Now each is counted
    before the first await; the cap holds, and the count returns to zero."""
    slow = _Echo(delay=1.0)
    app = _app(tmp_path, monkeypatch)
    server, t, port = _serve(app)

    async def attack() -> int:
        from websockets.asyncio.client import connect

        url = f"ws://127.0.0.1:{port}/i/{WID}/port/{slow.port}/"

        async def one() -> Any:
            try:
                return await connect(url, additional_headers={"Cookie": f"{proxy.COOKIE}={'s' * 43}"}, open_timeout=20,
                                     ping_interval=None)  # fmt: skip
            except Exception:
                return None

        opened = [c for c in await asyncio.gather(*(one() for _ in range(200))) if c is not None]
        alive = 0
        for c in opened:  # accepted, and really forwarding
            with contextlib.suppress(Exception):
                await c.send("x")
                if await asyncio.wait_for(c.recv(), 10) == "x":
                    alive += 1
        for c in opened:
            with contextlib.suppress(Exception):
                await c.close()
        return alive

    try:
        alive = asyncio.run(attack())
        deadline = time.monotonic() + 10
        while app.state.proxy.open_ws.get("usr_mallory", 0) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        server.should_exit = True
        t.join(10)
        slow.close()
    assert 0 < alive <= api_proxy.MAX_WS_PER_USER, alive
    assert app.state.proxy.open_ws.get("usr_mallory", 0) == 0
