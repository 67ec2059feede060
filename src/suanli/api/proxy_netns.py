"""The proxy's way into a sandbox with a network namespace of its own (`network: private`): its `ports:` listen on
the sandbox's own loopback, which the host's 127.0.0.1 is not. Each connection is a socket made in that namespace
(`suanli.sandbox.ns_socket`), then connected from the server's event loop like any other; httpx gets it through an
httpcore network backend (httpcore's documented extension point), so requests, streaming and the listener re-check
(`ProxyState.recheck`'s trace hook) work as on the host network.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import anyio
import httpcore
import httpx
from httpcore._backends.anyio import AnyIOStream  # maps anyio's errors to httpcore's, as its own backend does

from suanli.sandbox.ns_socket import socket_in


async def connect(sandbox_file: Path, host: str, port: int, timeout: float | None) -> socket.socket:
    """A socket connected to `host:port` inside the sandbox's network namespace (OSError or TimeoutError)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    made = asyncio.get_running_loop().run_in_executor(None, socket_in, sandbox_file, family)
    try:
        sock = await asyncio.shield(made)
    except asyncio.CancelledError:  # the caller went away: the socket made meanwhile is closed, not left to the GC
        made.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().close())
        raise
    sock.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), timeout)
    except BaseException:
        sock.close()
        raise
    return sock


class NamespaceBackend(httpcore.AsyncNetworkBackend):
    """TCP connections made inside one sandbox's network namespace."""

    def __init__(self, sandbox_file: Path) -> None:
        self.sandbox_file = sandbox_file

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: object = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            sock = await connect(self.sandbox_file, host, port, timeout)
        except TimeoutError as e:
            raise httpcore.ConnectTimeout(str(e)) from e
        except OSError as e:
            raise httpcore.ConnectError(str(e)) from e
        try:
            return AnyIOStream(await anyio.abc.SocketStream.from_socket(sock))
        except BaseException:
            sock.close()
            raise

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: object = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a sandbox's namespace is reached over TCP only")

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def client_into(sandbox_file: Path, timeout: httpx.Timeout) -> httpx.AsyncClient:
    """An HTTP client whose connections are made inside the sandbox's namespace; no keep-alive (as the host
    network's client: a pooled connection would outlive the check of its listener)."""
    transport = httpx.AsyncHTTPTransport()
    transport._pool = httpcore.AsyncConnectionPool(  # the transport's own pool, with the backend swapped in
        max_connections=100, max_keepalive_connections=0, network_backend=NamespaceBackend(sandbox_file)
    )
    return httpx.AsyncClient(transport=transport, timeout=timeout)


async def close_all(clients: list[httpx.AsyncClient]) -> None:
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()
