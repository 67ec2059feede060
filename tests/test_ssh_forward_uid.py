"""An `ssh -L` forward reaches the instance's port as the instance, never as the gateway (found by a hostile review).

On the host network the gateway used to connect to the forwarded port itself, from the server's uid (root): a
loopback service that tells callers apart by uid (an `iptables -m owner` fence around PostgreSQL, the Ray dashboard
or slurmrestd, or one that trusts root on loopback) saw any tenant as root. Every forward now goes through a relay
inside the sandbox. A process of another uid stands in for the sandbox's processes (`enter` runs as that uid, as
`suanli.sandbox.join` runs as the org's uid); tests/test_ssh_e2e.py forwards into real sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from suanli.ssh.hostkey import ensure_host_key
from suanli.ssh.keys import fingerprint_of
from suanli.ssh.server import Gateway, Grant, Limits, Target, listen

SANDBOX_UID = 65534  # what the stand-in instance's processes run as (a root server gives each org a uid of its own)


def _uid_of_local_socket(ip: str, port: int) -> int | None:
    """The uid owning the TCP socket whose local address is ip:port (from /proc/net/tcp)."""
    want = f"{''.join(reversed([f'{int(x):02X}' for x in ip.split('.')]))}:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1] == want:
            return int(f[7])
    return None


class WhoConnects:
    """A loopback service that answers each connection with the uid the connecting socket belongs to (as a service
    that trusts root on loopback, or an operator's `iptables -m owner` fence, tells callers apart)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.seen: list[int | None] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            with conn:
                uid = _uid_of_local_socket(peer[0], peer[1])
                self.seen.append(uid)
                with contextlib.suppress(OSError):
                    conn.sendall(f"uid={uid}\n".encode())

    def close(self) -> None:
        self.sock.close()


@dataclass
class HostNetBox:
    """An instance on the host network whose processes run as `SANDBOX_UID` (`enter` runs argv as that uid, as
    `suanli.sandbox.join` runs it inside the sandbox as the org's uid)."""

    fingerprint: str

    async def authorize(self, username: str, fingerprint: str, public_key: str) -> Grant | None:
        if username != "box" or fingerprint != self.fingerprint:
            return None
        return Grant("usr_1", "me@example.com", "wl_box", "box", 0, fingerprint)

    async def target(self, grant: Grant) -> Target:
        def enter(argv: list[str]) -> list[str]:
            run_as = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"]
            return [*run_as, "env", "PATH=/usr/bin:/bin", *argv]  # the instance's own python3

        return Target(enter)

    async def revoked(self, grants: list[Grant]) -> dict[Grant, str]:
        return {}


@pytest.fixture
def host_net_gateway(tmp_path: Path) -> Iterator[tuple[int, asyncssh.SSHKey, asyncio.AbstractEventLoop]]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    access = HostNetBox(fingerprint_of(key))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    held: list[Any] = []

    async def start() -> None:
        gw = Gateway(access, Limits())
        held.append(await listen(gw, "127.0.0.1", 0, ensure_host_key(tmp_path / "home")))
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(30)
    port = int(held[0].get_port())
    yield port, key, loop
    loop.call_soon_threadsafe(held[0].close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _through_gateway(port: int, key: asyncssh.SSHKey, loop: asyncio.AbstractEventLoop, dest_port: int) -> bytes:
    async def go() -> bytes:
        async with asyncssh.connect("127.0.0.1", port, username="box", client_keys=[key], known_hosts=None,
                                    agent_path=None) as conn:  # fmt: skip
            reader, writer = await conn.open_connection("127.0.0.1", dest_port)
            data = await asyncio.wait_for(reader.read(100), 10)
            writer.close()
            return data

    return asyncio.run_coroutine_threadsafe(go(), loop).result(30)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the stand-in instance as another uid")
def test_a_forward_of_a_host_network_instance_connects_as_the_instance_not_as_the_server(
    host_net_gateway: tuple[int, asyncssh.SSHKey, asyncio.AbstractEventLoop],
) -> None:
    """`ssh -L 5432:127.0.0.1:5432 box@gateway` on a host-network instance: the service on the port sees the
    instance's uid, as when the instance connects itself, not the gateway's (root)."""
    svc = WhoConnects()
    try:
        # What the instance itself gets: a connection from its own uid.
        inside = subprocess.run(["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                                 sys.executable, "-c", "import socket,sys;s=socket.create_connection(('127.0.0.1',"
                                 f"{svc.port}));print(s.recv(100).decode().strip())"],
                                capture_output=True, text=True, timeout=30)  # fmt: skip
        assert inside.stdout.strip() == f"uid={SANDBOX_UID}", inside
        port, key, loop = host_net_gateway
        got = _through_gateway(port, key, loop, svc.port).decode().strip()
        assert got == f"uid={SANDBOX_UID}", f"the forward reached the service as {got} (the gateway's own uid)"
    finally:
        svc.close()
