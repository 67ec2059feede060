"""What a tenant can make the server itself connect to, read or write, under a hostile review's attacks, which held.

The SSH gateway refuses remote forwards, Unix-socket forwards both ways, tun/tap and non-loopback destinations; the
proxy's port checks refuse ports shared with another listener on any loopback address, odd port spellings, and
never follow an upstream's redirect; a volume's planted links are never read or written through by the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from fastapi.testclient import TestClient

from suanli.ssh.hostkey import ensure_host_key
from suanli.ssh.keys import fingerprint_of
from suanli.ssh.server import Gateway, Limits, listen
from tests.control_plane import signup
from tests.listener_helpers import free_port, sandbox_file, start_boxed, stop
from tests.test_proxy_listener_recheck import Foreign
from tests.test_ssh_forward_uid import HostNetBox as Box

API = "/api/v1"


# ---- the SSH gateway -----------------------------------------------------------------------------------------------
@dataclass
class Gw:
    port: int
    key: asyncssh.SSHKey
    loop: asyncio.AbstractEventLoop

    def run(self, fn: Any, login: str = "box") -> Any:
        async def go() -> Any:
            async with asyncssh.connect("127.0.0.1", self.port, username=login, client_keys=[self.key],
                                        known_hosts=None, agent_path=None) as conn:  # fmt: skip
                return await fn(conn)

        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(60)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gw]:
    tmp = tmp_path_factory.mktemp("gw2")
    key = asyncssh.generate_private_key("ssh-ed25519")
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    held: list[Any] = []

    async def start() -> None:
        held.append(await listen(Gateway(Box(fingerprint_of(key)), Limits()), "127.0.0.1", 0,
                                 ensure_host_key(tmp / "home")))  # fmt: skip
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield Gw(int(held[0].get_port()), key, loop)
    loop.call_soon_threadsafe(held[0].close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_remote_forwarding_binds_nothing_on_the_host(gw: Gw) -> None:
    port = free_port()

    async def ask(conn: asyncssh.SSHClientConnection) -> str:
        for host in ("127.0.0.1", "0.0.0.0", ""):
            with contextlib.suppress(Exception):
                await conn.forward_remote_port(host, port, "127.0.0.1", 22)
                return f"listening on {host}:{port}"
        return "refused"

    assert gw.run(ask) == "refused"
    assert not _listening(port)


def test_unix_socket_forwarding_is_refused_both_ways(gw: Gw, tmp_path: Path) -> None:
    path = str(tmp_path / "server.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)
    srv.settimeout(0.5)
    listen_path = str(tmp_path / "planted.sock")

    async def ask(conn: asyncssh.SSHClientConnection) -> list[str]:
        out = []
        try:
            await conn.open_unix_connection(path)
            out.append("direct-streamlocal opened")
        except asyncssh.Error:
            pass
        try:
            await conn.forward_remote_path(listen_path, path)
            out.append("streamlocal-forward opened")
        except (asyncssh.Error, asyncssh.ChannelListenError, OSError):
            pass
        return out

    try:
        assert gw.run(ask) == []
        with pytest.raises(TimeoutError):
            srv.accept()
        assert not os.path.exists(listen_path)
    finally:
        srv.close()


def test_tun_and_tap_are_refused(gw: Gw) -> None:
    async def ask(conn: asyncssh.SSHClientConnection) -> list[str]:
        out = []
        for opener in (conn.open_tun, conn.open_tap):
            try:
                await opener()
                out.append(opener.__name__)
            except (asyncssh.Error, OSError):
                pass
        return out

    assert gw.run(ask) == []


HOSTS = ["127.0.0.2", "0.0.0.0", "127.1", "2130706433", "0x7f000001", "::ffff:127.0.0.1", "localhost.",
         "127.0.0.1.nip.io", "192.0.2.1", "localhost\x00", " 127.0.0.1", "[::1]", "169.254.169.254"]  # fmt: skip


def test_forwards_to_anything_but_the_loopback_names_are_refused(gw: Gw) -> None:
    svc = socket.create_server(("0.0.0.0", 0))  # listens on every address of the host
    svc.settimeout(0.5)
    port = int(svc.getsockname()[1])

    async def ask(conn: asyncssh.SSHClientConnection) -> list[str]:
        opened = []
        for host in HOSTS:
            try:
                _, w = await conn.open_connection(host, port)
                opened.append(host)
                w.close()
            except asyncssh.Error:
                pass
        return opened

    try:
        assert gw.run(ask) == []
        with pytest.raises(TimeoutError):
            svc.accept()
    finally:
        svc.close()


# ---- the ports: proxy ----------------------------------------------------------------------------------------------
HOLD6 = ("import socket,sys,time\ns=socket.socket(socket.AF_INET6)\n"
         "s.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_V6ONLY,1)\ns.bind(('::',int(sys.argv[2])))\ns.listen(4)\n"
         "print('up',flush=True)\ntime.sleep(600)\n")  # fmt: skip


def test_a_port_the_sandbox_shares_with_another_listener_on_any_loopback_is_not_proxied(tmp_path: Path) -> None:
    from suanli.sandbox.listeners import owned_listener

    port = free_port()
    bwrap, init = start_boxed("tenant", port, HOLD6)
    try:
        box = sandbox_file(tmp_path / "sandbox.json", bwrap, init)
        assert owned_listener(box, port) == "::1"
        other = socket.create_server(("127.0.0.1", port))  # someone else's, on IPv4 loopback
        try:
            assert owned_listener(box, port) is None
        finally:
            other.close()
    finally:
        stop(bwrap)
    port = free_port()
    bwrap, init = start_boxed("tenant", port)
    try:
        box = sandbox_file(tmp_path / "sandbox.json", bwrap, init)
        assert owned_listener(box, port) == "127.0.0.1"
        for fam, addr in ((socket.AF_INET6, "::1"), (socket.AF_INET6, "::ffff:127.0.0.1")):
            with contextlib.suppress(OSError), socket.socket(fam) as other:
                if addr == "::1":
                    other.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                other.bind((addr, port))
                other.listen(1)
                assert owned_listener(box, port) is None, addr
    finally:
        stop(bwrap)


@pytest.mark.parametrize("text", ["0", "1023", "65536", "70000", "05432", "+8080", "8080 ", "0x1f90", "١٢٣٤", "-1"])
def test_odd_port_spellings_in_the_proxy_path_are_not_found(text: str) -> None:
    from suanli.api.routers.instances import _port
    from suanli.control.errors import NotFound

    with pytest.raises(NotFound):
        _port(text)


def test_the_proxy_relays_an_upstream_redirect_and_never_follows_it(tmp_path: Path) -> None:
    from suanli.api import proxy as api_proxy
    from suanli.control.workloads import proxy as cproxy

    target_port = free_port()
    foreign = Foreign(target_port)
    port = free_port()
    redirect = (b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/secret\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n") % target_port  # fmt: skip
    code = ("import socket,sys\ns=socket.create_server(('127.0.0.1',int(sys.argv[2])))\nprint('up',flush=True)\n"
            f"while True:\n c,_=s.accept(); c.recv(65536); c.sendall({redirect!r}); c.close()\n")  # fmt: skip
    bwrap, init = start_boxed("tenant", port, code)
    try:
        up = cproxy.Upstream("box", port=port, sandbox_file=sandbox_file(tmp_path / "sandbox.json", bwrap, init))
        state = api_proxy.ProxyState(db=None, home=tmp_path)  # type: ignore[arg-type]

        async def go() -> int:
            try:
                client, url = await state.client_and_url(up, b"/", b"")
                resp = await client.send(client.build_request("GET", url, extensions=state.recheck(up)), stream=True)
                await resp.aclose()
                return resp.status_code
            finally:
                await state.aclose()

        assert asyncio.run(go()) == 302
        assert foreign.accepted == 0
    finally:
        stop(bwrap)
        foreign.sock.close()


# ---- volumes: links planted by a job --------------------------------------------------------------------------------
@pytest.fixture
def vol(api: TestClient, tmp_path: Path) -> tuple[TestClient, dict[str, str], Path, Path]:
    t = signup(api, "tenant@example.com")  # type: ignore[arg-type]
    r = api.post(f"{API}/volumes", json={"name": "v", "size": "64Mi"}, headers=t.headers)
    assert r.status_code == 201, r.text
    data = next((tmp_path / "home").rglob("vols/*/data"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("HOST-SECRET")
    # What a job that mounts the volume writable plants in it:
    os.symlink(str(outside / "secret.txt"), data / "link")
    os.symlink(str(outside), data / "d")
    (data / "tree").mkdir()
    os.symlink(str(outside / "secret.txt"), data / "tree" / "l")
    os.symlink("/etc", data / "tree" / "etc")
    return api, t.headers, data, outside


def test_the_server_never_reads_through_a_link_planted_in_a_volume(
    vol: tuple[TestClient, dict[str, str], Path, Path],
) -> None:
    api, h, _, _ = vol
    for path in ("link", "d/secret.txt", "tree/l", "tree/etc/hostname", "tree/etc/passwd"):
        r = api.get(f"{API}/volumes/v/files", params={"path": path}, headers=h)
        assert r.status_code in (404, 409, 422) and "HOST-SECRET" not in r.text, (path, r.status_code, r.text)
        r = api.get(f"{API}/volumes/v/stat", params={"path": path, "sha256": "true"}, headers=h)
        assert "HOST-SECRET" not in r.text and '"file"' not in r.text, (path, r.text)
    r = api.get(f"{API}/volumes/v/ls", params={"path": "d"}, headers=h)
    assert r.status_code in (404, 422) and "secret.txt" not in r.text, r.text
    r = api.get(f"{API}/volumes/v/tree", params={"path": "tree"}, headers=h)
    assert r.status_code == 200, r.text
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r|*") as tar:
        for m in tar:
            assert not m.isfile() or b"HOST-SECRET" not in (tar.extractfile(m) or io.BytesIO()).read(), m.name
            assert not m.name.startswith("etc/") and "/etc/" not in m.name, m.name
    r = api.get(f"{API}/volumes/v/tree", params={"path": "d"}, headers=h)
    assert r.status_code != 200 or b"HOST-SECRET" not in r.content


def test_the_server_never_writes_through_a_link_planted_in_a_volume(
    vol: tuple[TestClient, dict[str, str], Path, Path],
) -> None:
    api, h, data, outside = vol
    before = sorted(p.name for p in outside.iterdir())
    for path in ("d/new.txt", "d/secret.txt", "tree/etc/evil"):
        r = api.put(f"{API}/volumes/v/files", params={"path": path}, content=b"PWNED", headers=h)
        assert r.status_code in (404, 409, 422), (path, r.status_code, r.text)
        r = api.delete(f"{API}/volumes/v/files", params={"path": path}, headers=h)
        assert r.status_code in (404, 409, 422), (path, r.status_code, r.text)
    r = api.put(f"{API}/volumes/v/files", params={"path": "link"}, content=b"PWNED", headers=h)  # replaces the link
    assert r.status_code in (200, 201, 404, 409, 422), r.text
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("x.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"PWNED"))
    r = api.put(f"{API}/volumes/v/tree", params={"path": "d"}, content=buf.getvalue(), headers=h)
    assert r.status_code in (404, 409, 422), r.text
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (outside / "secret.txt").read_text() == "HOST-SECRET"
    assert not Path("/etc/evil").exists()
    assert data.is_dir()
