"""The `ports:` proxy sends nothing to a listener that is not the instance's, even when the port changes hands
between the check and the connect (found by a hostile review).

The proxy checks that the sandbox holds the listener on P, then connects to 127.0.0.1:P by number. A tenant's
process that lets go of P right after the check, while somebody else's service binds it (a restarting serving
replica, another tenant's service), would have had the tenant's request or WebSocket delivered to that service.
The listener is now checked again once connected, before a byte goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suanli.api import proxy as api_proxy
from suanli.control.workloads import proxy as cproxy
from tests.listener_helpers import free_port, start_boxed, stop


class Foreign:
    """Somebody else's service on the port: a listener of this test process, no sandbox's; records what it is sent."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 10
        while True:  # the killed holder's socket closes as its process exits, a moment after the kill
            try:
                self.sock.bind(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self.sock.listen(8)
        self.received = b""
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with c:
                c.settimeout(2)
                with contextlib.suppress(OSError):
                    while chunk := c.recv(65536):
                        self.received += chunk
                        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\nSOMEONE-ELSES")


@pytest.fixture
def port_changes_hands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[cproxy.Upstream, list]]:
    """An instance whose sandbox holds port P at the proxy's first check, and lets go of it just after, when
    another service takes it."""
    port = free_port()
    bwrap, init = start_boxed("tenant", port)
    box = tmp_path / "rank-0.sandbox.json"
    box.write_text(json.dumps({"init_pid": init, "bwrap_pids": [bwrap.pid]}))
    foreign: list[Foreign] = []
    real = api_proxy.owned_listener

    def checked_then_released(sandbox_file: Path, p: int) -> str | None:
        addr = real(sandbox_file, p)
        if not foreign:
            stop(bwrap)
            foreign.append(Foreign(p))
        return addr

    monkeypatch.setattr(api_proxy, "owned_listener", checked_then_released)
    try:
        yield cproxy.Upstream("tenant-box", port=port, sandbox_file=box), foreign
    finally:
        stop(bwrap)
        for f in foreign:
            f.sock.close()


def test_an_http_request_is_not_sent_to_whoever_took_the_port(port_changes_hands: Any, tmp_path: Path) -> None:
    up, foreign = port_changes_hands
    state = api_proxy.ProxyState(db=None, home=tmp_path)  # type: ignore[arg-type]

    async def go() -> None:
        try:
            client, url = await state.client_and_url(up, b"/secret-path", b"")
            req = client.build_request("GET", url, headers={"authorization": "tenant"}, extensions=state.recheck(up))
            with pytest.raises(api_proxy.NotReady):
                await client.send(req)
        finally:
            await state.aclose()

    asyncio.run(go())
    assert foreign and foreign[0].received == b""


def test_a_websocket_is_not_opened_to_whoever_took_the_port(port_changes_hands: Any, tmp_path: Path) -> None:
    up, foreign = port_changes_hands
    state = api_proxy.ProxyState(db=None, home=tmp_path)  # type: ignore[arg-type]

    async def go() -> None:
        try:
            with pytest.raises(api_proxy.NotReady):
                await state.raw_socket(up)
        finally:
            await state.aclose()

    asyncio.run(go())
    assert foreign and foreign[0].received == b""


def test_a_port_that_stays_the_instances_is_proxied(tmp_path: Path) -> None:
    """The check after the connect passes while the instance keeps its listener: its answer comes back."""
    port = free_port()
    bwrap, init = start_boxed("tenant", port)
    box = tmp_path / "rank-0.sandbox.json"
    box.write_text(json.dumps({"init_pid": init, "bwrap_pids": [bwrap.pid]}))
    up = cproxy.Upstream("tenant-box", port=port, sandbox_file=box)
    state = api_proxy.ProxyState(db=None, home=tmp_path)  # type: ignore[arg-type]

    async def go() -> str:
        try:
            client, url = await state.client_and_url(up, b"/", b"")
            r = await client.send(client.build_request("GET", url, extensions=state.recheck(up)))
            return r.text
        finally:
            await state.aclose()

    try:
        assert asyncio.run(go()) == "tenant"
    finally:
        stop(bwrap)
