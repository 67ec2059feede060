"""Instances in a browser, end to end: a `suanli server` process, instances running in bubblewrap sandboxes on the
local executor, a real JupyterLab inside one (started by its spec) and inside another (started on demand), a real
kernel executing `2+2` over the proxied WebSocket, a port the instance serves, and every way in refused to
whoever it is not for: another tenant, the operator, a used or foreign ticket, a cross-site request, a port the
sandbox does not hold, a symlink swapped in for JupyterLab's socket."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.control_plane import LiveServer, Tenant, admin_token, bearer, free_port, live_server, signup

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)
FAST = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "SUANLI_STOP_GRACE_S": "2"}
JUPYTER_WAIT_S = 120  # JupyterLab takes 5-20 s to start on two busy cores


@dataclass
class World:
    srv: LiveServer
    http: httpx.Client
    tenant: Tenant
    mallory: Tenant
    admin: dict[str, str]
    lab_box: str  # started with `jupyter: true` and `ports: [web_port]`
    plain_box: str  # no jupyter in its spec: started on demand
    mallory_box: str
    web_port: int


def _submit(http: httpx.Client, who: Tenant, spec: dict[str, object]) -> str:
    r = http.post("/api/v1/workloads", json={"spec": spec}, headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _wait_running(http: httpx.Client, who: Tenant, wid: str) -> None:
    deadline = time.monotonic() + 60
    while (state := http.get(f"/api/v1/workloads/{wid}", headers=who.headers).json())["state"] != "running":
        assert time.monotonic() < deadline and state["state"] in ("pending", "scheduled", "starting"), state
        time.sleep(0.2)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if shutil.which("jupyter", path=os.path.dirname(sys.executable)) is None:
        pytest.fail("jupyterlab is not installed in the test environment (it is in the dev extras)")
    tmp = tmp_path_factory.mktemp("proxy-e2e")
    web_port = free_port()
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'suanli.db'}", env=FAST) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).status_code == 201  # fmt: skip
        tenant, mallory = signup(http, "tenant@example.com"), signup(http, "mallory@example.com")
        for who in (tenant, mallory):
            r = http.post(f"/api/v1/admin/orgs/{who.org_id}/transactions", json={"kind": "topup", "amount": "100"},
                          headers=adm)  # fmt: skip
            assert r.status_code == 201, r.text
        serve = f"echo served-by-the-instance > hello.txt; exec python3 -m http.server {web_port} --bind 127.0.0.1"
        lab_box = _submit(http, tenant, {"name": "lab-box", "kind": "instance", "command": serve, "jupyter": True,
                                         "ports": [web_port], "resources": {"gpus": 0}})  # fmt: skip
        plain_box = _submit(http, tenant, {"name": "plain-box", "kind": "instance", "resources": {"gpus": 0}})
        mallory_box = _submit(http, mallory, {"name": "evil-box", "kind": "instance", "resources": {"gpus": 0},
                                              "ports": [web_port + 1 if web_port < 65535 else 1024]})  # fmt: skip
        for who, wid in ((tenant, lab_box), (tenant, plain_box), (mallory, mallory_box)):
            _wait_running(http, who, wid)
        try:
            yield World(srv, http, tenant, mallory, adm, lab_box, plain_box, mallory_box, web_port)
        finally:  # instances outlive the server process (a restarted server re-attaches): stop them
            for who, wid in ((tenant, lab_box), (tenant, plain_box), (mallory, mallory_box)):
                http.post(f"/api/v1/workloads/{wid}/stop", headers=who.headers)
            deadline = time.monotonic() + 30
            for who, wid in ((tenant, lab_box), (tenant, plain_box), (mallory, mallory_box)):
                while time.monotonic() < deadline and http.get(f"/api/v1/workloads/{wid}",
                                                               headers=who.headers).json()["state"] == "running":  # fmt: skip
                    time.sleep(0.3)
            http.close()


def _link(world: World, who: Tenant, wid: str, port: int | None = None) -> httpx.Response:
    return world.http.post(f"/api/v1/workloads/{wid}/proxy", json={"port": port} if port else {}, headers=who.headers)


def _browser(world: World, who: Tenant, wid: str, port: int | None = None) -> httpx.Client:
    """A browser signed in to one instance: a fresh cookie jar that followed a ticket link."""
    r = _link(world, who, wid, port)
    assert r.status_code == 200, r.text
    link = r.json()["url"]
    assert link.startswith(f"/i/{wid}/auth?ticket=") and who.token not in link
    b = httpx.Client(base_url=world.srv.url, timeout=30)
    page = b.get(link)
    assert page.status_code == 200 and "refresh" in page.text, page.text
    cookie = page.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and f"path=/i/{wid}/" in cookie, cookie
    return b


def _wait_lab(b: httpx.Client, wid: str) -> dict[str, object]:
    deadline = time.monotonic() + JUPYTER_WAIT_S
    while True:
        r = b.get(f"/i/{wid}/lab/api/status")
        if r.status_code == 200:
            return dict(r.json())
        assert r.status_code == 503 and time.monotonic() < deadline, (r.status_code, r.text[:2000])
        assert r.headers.get("retry-after") == "2"
        time.sleep(1)


def _execute(b: httpx.Client, world: World, wid: str, code: str) -> str:
    """Start a kernel through the proxy and run `code` over its WebSocket: the text/plain of the result."""
    r = b.post(f"/i/{wid}/lab/api/kernels", json={"name": "python3"})
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    cookie = "; ".join(f"{k}={v}" for k, v in b.cookies.items())
    url = world.srv.url.replace("http://", "ws://") + f"/i/{wid}/lab/api/kernels/{kernel}/channels"
    msg_id = uuid.uuid4().hex
    request = {"header": {"msg_id": msg_id, "username": "t", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                          "version": "5.3"}, "parent_header": {}, "metadata": {}, "channel": "shell",
               "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                           "allow_stdin": False}}  # fmt: skip
    with connect(url, additional_headers={"Cookie": cookie}, open_timeout=30) as ws:
        ws.send(json.dumps(request))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reply = json.loads(ws.recv(timeout=60))
            if reply.get("parent_header", {}).get("msg_id") == msg_id and reply["msg_type"] == "execute_result":
                return str(reply["content"]["data"]["text/plain"])
    raise AssertionError("no execute_result")


def test_jupyterlab_runs_a_kernel_through_the_proxy(world: World) -> None:
    b = _browser(world, world.tenant, world.lab_box)
    assert "started" in _wait_lab(b, world.lab_box)
    page = b.get(f"/i/{world.lab_box}/lab/lab")  # the Lab page itself, with its assets' base URL under the proxy
    assert page.status_code == 200 and f"/i/{world.lab_box}/lab/" in page.text
    assert _execute(b, world, world.lab_box, "2+2") == "4"
    # The kernel runs inside the sandbox: the server's data directory does not exist there.
    assert _execute(b, world, world.lab_box, f"__import__('os').path.exists({str(world.srv.home)!r})") == "False"
    # Its channels are Unix sockets in the instance's own directory, not TCP on the host's shared 127.0.0.1, where
    # any job on the host subscribed to its output and read every cell (a hostile review).
    info = "(lambda i: (i['transport'], i['ip']))(__import__('ipykernel.connect').connect.get_connection_info(unpack=True))"
    assert _execute(b, world, world.lab_box, info) == "('ipc', '/run/suanli-proxy/kernel')"


def test_jupyterlab_starts_on_demand_in_an_instance_without_it(world: World) -> None:
    r = _link(world, world.tenant, world.plain_box)
    assert r.status_code == 200 and r.json()["started_jupyter"] is True, r.text
    b = _browser(world, world.tenant, world.plain_box)  # a second link: started already, not started twice
    assert "started" in _wait_lab(b, world.plain_box)
    assert _execute(b, world, world.plain_box, "6*7") == "42"


def test_a_port_the_instance_serves(world: World) -> None:
    b = _browser(world, world.tenant, world.lab_box, world.web_port)
    deadline = time.monotonic() + 30
    while (r := b.get(f"/i/{world.lab_box}/port/{world.web_port}/hello.txt")).status_code == 503:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.3)
    assert (r.status_code, r.text) == (200, "served-by-the-instance\n")
    assert b.get(f"/i/{world.lab_box}/port/{world.web_port}").status_code in (200, 307)
    # The session is the instance's, not the port's: the same cookie opens its Lab too.
    assert b.get(f"/i/{world.lab_box}/lab/api/status").status_code in (200, 503)


def test_another_tenant_gets_nowhere(world: World) -> None:
    wid = world.lab_box
    assert _link(world, world.mallory, wid).status_code == 404  # no link into another org's instance
    assert _link(world, world.mallory, "lab-box").status_code == 404  # nor by name
    anon = httpx.Client(base_url=world.srv.url, timeout=30)
    assert anon.get(f"/i/{wid}/lab/api/status").status_code == 403
    assert anon.get(f"/i/{wid}/port/{world.web_port}/hello.txt").status_code == 403
    # Mallory signed in to her own instance: her cookie, sent on the tenant's paths, opens nothing.
    mine = _browser(world, world.mallory, world.mallory_box, None)
    secret = next(iter(mine.cookies.values()))
    stolen = httpx.Client(base_url=world.srv.url, timeout=30, cookies={"suanli_proxy": secret})
    assert stolen.get(f"/i/{wid}/lab/api/status").status_code == 403
    assert stolen.get(f"/i/{wid}/port/{world.web_port}/hello.txt").status_code == 403
    with pytest.raises(InvalidStatus):  # the WebSocket handshake is refused
        connect(world.srv.url.replace("http://", "ws://") + f"/i/{wid}/lab/api/events/subscribe",
                additional_headers={"Cookie": f"suanli_proxy={secret}"}, open_timeout=10).close()  # fmt: skip


def test_the_operator_has_no_way_in(world: World) -> None:
    r = world.http.post(f"/api/v1/workloads/{world.lab_box}/proxy", json={}, headers=world.admin)
    assert r.status_code == 404, r.text


def test_a_ticket_works_once_and_only_for_its_instance(world: World) -> None:
    link = _link(world, world.tenant, world.lab_box).json()["url"]
    other = link.replace(world.lab_box, world.plain_box)
    b = httpx.Client(base_url=world.srv.url, timeout=30)
    assert b.get(other).status_code == 403  # a ticket for one instance does not open another
    assert b.get(link).status_code == 200
    again = httpx.Client(base_url=world.srv.url, timeout=30)
    assert again.get(link).status_code == 403  # copied out of a log afterwards: dead
    assert again.get(f"/i/{world.lab_box}/auth?ticket=" + "x" * 43).status_code == 403
    assert again.get("/i/not-an-id/auth?ticket=" + "x" * 43).status_code == 404


def test_a_cross_site_request_is_refused(world: World) -> None:
    b = _browser(world, world.tenant, world.lab_box)
    _wait_lab(b, world.lab_box)
    r = b.post(f"/i/{world.lab_box}/lab/api/kernels", json={}, headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    r = b.post(f"/i/{world.lab_box}/lab/api/kernels", json={}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    with pytest.raises(InvalidStatus):
        connect(world.srv.url.replace("http://", "ws://") + f"/i/{world.lab_box}/lab/api/events/subscribe",
                additional_headers={"Cookie": "; ".join(f"{k}={v}" for k, v in b.cookies.items())},
                origin="https://evil.example", open_timeout=10).close()  # type: ignore[arg-type]  # fmt: skip


def test_a_port_held_outside_the_sandbox_is_not_reached(world: World) -> None:
    """Mallory lists a port that a host service listens on: the proxy does not forward to what her sandbox does
    not hold (on the shared host network a port number alone would reach anybody's service)."""
    port = (world.web_port + 1) if world.web_port < 65535 else 1024
    host_service = socket.socket()
    host_service.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    host_service.bind(("127.0.0.1", port))
    host_service.listen()
    try:
        b = _browser(world, world.mallory, world.mallory_box, port)
        r = b.get(f"/i/{world.mallory_box}/port/{port}/")
        assert r.status_code == 503 and "listens" in r.text, r.text
        host_service.settimeout(0.5)
        with pytest.raises(TimeoutError):
            host_service.accept()  # nothing was ever forwarded to it
    finally:
        host_service.close()
    assert _link(world, world.mallory, world.mallory_box, world.web_port).status_code == 422  # not one of hers


def test_a_symlink_in_place_of_the_socket_is_not_followed(world: World) -> None:
    """The proxy directory is the tenant's: swap JupyterLab's socket for a symlink to another instance's socket,
    and the proxy refuses rather than follows it."""
    b = _browser(world, world.tenant, world.plain_box)
    _wait_lab(b, world.plain_box)
    home = world.srv.home
    mine = home / "workloads" / world.plain_box / "proxy" / "jupyter.sock"
    victim = home / "workloads" / world.lab_box / "proxy" / "jupyter.sock"
    moved = mine.with_name("moved.sock")
    mine.rename(moved)
    try:
        mine.symlink_to(victim)
        deadline = time.monotonic() + 15
        while (r := b.get(f"/i/{world.plain_box}/lab/api/status")).status_code == 200:
            assert time.monotonic() < deadline, "the proxy followed the symlink"
            time.sleep(0.5)
        assert r.status_code == 503
    finally:
        mine.unlink()
        moved.rename(mine)


def test_a_stopped_instance_is_closed(world: World, tmp_path: Path) -> None:
    wid = _submit(world.http, world.tenant, {"name": "short-box", "kind": "instance", "resources": {"gpus": 0}})
    _wait_running(world.http, world.tenant, wid)
    b = _browser(world, world.tenant, wid)
    assert world.http.post(f"/api/v1/workloads/{wid}/stop", headers=world.tenant.headers).status_code == 200
    deadline = time.monotonic() + 30
    while (r := b.get(f"/i/{wid}/lab/api/status")).status_code != 409:
        assert time.monotonic() < deadline and r.status_code == 503, (r.status_code, r.text)
        time.sleep(0.5)
    assert "stopped" in r.text or "stopping" in r.text or "exited" in r.text
    assert _link(world, world.tenant, wid).status_code == 409


def test_the_cli_prints_a_link(world: World) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUANLI_")}
    env.update(SUANLI_HOME=str(world.srv.home.parent / "cli"), SUANLI_SERVER=world.srv.url,
               SUANLI_TOKEN=world.tenant.token)  # fmt: skip
    for args in (["jupyter", "lab-box", "--print"], ["open", "lab-box", str(world.web_port), "--print"]):
        p = subprocess.run([sys.executable, "-m", "suanli.cli.main", *args], capture_output=True, text=True, env=env,
                           timeout=60)  # fmt: skip
        assert p.returncode == 0, p.stderr
        url = p.stdout.strip()
        assert url.startswith(f"{world.srv.url}/i/{world.lab_box}/auth?ticket=")
        assert httpx.get(url).status_code == 200
