"""Attacks on the instance proxy (`/i/<id>/lab/`, `/i/<id>/port/<N>/`) by a tenant who controls what runs in their
own instance, and what they can make their own service answer. Each test names its attack and fails while the
proxy is open to it.

The first tests run the proxy's routes in-process against a fake upstream (fast); the last ones need real
bubblewrap sandboxes and a `suanli server` process, like tests/test_proxy_e2e.py.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from suanli.api import proxy as api_proxy
from suanli.api import proxy_headers
from suanli.api.routers import instances
from suanli.control.ids import utcnow
from suanli.control.workloads import proxy

WID = "wl_0123456789abcdef"


# ---- in-process: the proxy's routes in front of a fake upstream ----------------------------------------------------
@dataclass
class Proxied:
    client: TestClient
    seen: list[httpx.Request]


def proxy_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str, tcp: httpx.AsyncClient | None) -> FastAPI:
    """The proxy's pages, signed in as `user` to any instance, whose ports are whatever is asked for and held by its
    sandbox; upstreams through `tcp` (None: the proxy's own client, to real sockets)."""

    async def grant(self: Any, wid: str, secret: str | None, now: Any) -> proxy.Grant:
        return proxy.Grant(user, wid, utcnow() + timedelta(hours=1))

    async def upstream(self: Any, wid: str, target: str) -> proxy.Upstream:
        port = int(target.split(":", 1)[1]) if target.startswith("port:") else None
        return proxy.Upstream("box", port=port, sandbox_file=tmp_path / "sandbox.json")

    async def port_address(self: Any, up: proxy.Upstream) -> str:
        return "127.0.0.1"  # the sandbox holds the listener on up.port

    monkeypatch.setattr(api_proxy.ProxyState, "grant", grant)
    monkeypatch.setattr(api_proxy.ProxyState, "upstream", upstream)
    monkeypatch.setattr(api_proxy.ProxyState, "_port_address", port_address)
    app = FastAPI()
    app.include_router(instances.pages)
    state = api_proxy.ProxyState(db=None, home=tmp_path)  # type: ignore[arg-type]
    state.tcp = tcp
    app.state.proxy = state
    app.state.server = SimpleNamespace(settings=SimpleNamespace(home=tmp_path))
    return app


@pytest.fixture
def proxied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A factory: the proxy's pages in front of an upstream answered by `handler` (an httpx MockTransport), signed in
    to instance WID, whose ports are whatever is asked for and held by its sandbox."""

    def make(handler: Any) -> Proxied:
        seen: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return handler(request)

        app = proxy_app(tmp_path, monkeypatch, "usr_tenant", httpx.AsyncClient(transport=httpx.MockTransport(record)))
        client = TestClient(app, raise_server_exceptions=False, cookies={proxy.COOKIE: "s" * 43})
        return Proxied(client, seen)

    yield make


def test_a_leading_zero_in_the_port_does_not_change_the_port_connected_to(proxied: Any) -> None:
    """SSRF. `/i/<id>/port/04444/x` passes every check as port 4444 (int("04444")), but the path to forward is cut
    at the length of "/i/<id>/port/4444", so it starts with "4/x" and the upstream URL becomes
    http://127.0.0.1:4444 + "4/x" = http://127.0.0.1:44444/x: any loopback port P*10+P%10 (another tenant's
    service, the host's own) is reached through a port the attacker's sandbox holds."""
    p = proxied(lambda r: httpx.Response(200, text="upstream"))
    r = p.client.get(f"/i/{WID}/port/04444/secret.txt")
    assert r.status_code == 404 or all(req.url.port == 4444 for req in p.seen), [str(req.url) for req in p.seen]
    assert all(req.url.path.startswith("/") for req in p.seen)


def test_a_service_cannot_widen_a_service_worker_or_plant_cookies_outside_its_prefix(proxied: Any) -> None:
    """Same-origin takeover. Everything under /i/ is one origin, and the proxy passes an upstream's response headers
    unchanged. A tenant's page at /i/<mine>/port/N/ answers its script with `Service-Worker-Allowed: /` and
    registers a service worker for scope `/` (demonstrated in Chromium): it then intercepts every later navigation
    to this server, including a victim's `/i/<victim>/auth?ticket=...` link (`suanli jupyter`), sends the ticket
    to the attacker, who redeems it for a 12-hour session in the victim's JupyterLab. A victim only has to open
    one link the attacker sent (the attacker's own ticket). `Set-Cookie: ...; Path=/` (or Path=/i/<victim>/,
    overwriting the victim's HttpOnly session) plants cookies on the whole server."""
    prefix = f"/i/{WID}/port/4444"
    evil = [("service-worker-allowed", "/"), ("set-cookie", "planted=1; Path=/"),
            ("set-cookie", f"{proxy.COOKIE}=junk; Path=/i/wl_fedcba9876543210/"), ("content-type", "text/javascript")]  # fmt: skip
    p = proxied(lambda r: httpx.Response(200, headers=evil, text="self.onfetch = () => {}"))
    r = p.client.get(f"{prefix}/sw.js", headers={"Service-Worker": "script"})
    if r.status_code == 200:
        assert "service-worker-allowed" not in r.headers
    for cookie in r.headers.get_list("set-cookie"):
        attrs = {k.strip().lower(): v.strip() for k, _, v in (a.partition("=") for a in cookie.split(";")[1:])}
        name = cookie.split("=", 1)[0].strip()
        assert name != proxy.COOKIE, cookie
        assert attrs.get("path", "").startswith(prefix + "/"), cookie


def test_a_service_worker_script_is_not_served_and_redirects_stay_on_this_server(proxied: Any) -> None:
    """A service worker registered from an instance page would control every page of the origin it is served on
    (whatever its scope header says, a script at /i/<id>/port/N/ could still claim that prefix for pages a victim
    opens there later); a redirect off the server (`Location: //evil.example/`) would make this origin an open
    redirect for phishing."""
    p = proxied(lambda r: httpx.Response(200, text="self.onfetch = () => {}"))
    assert p.client.get(f"/i/{WID}/port/4444/sw.js", headers={"Service-Worker": "script"}).status_code == 403
    for target in ("//evil.example/x", "https://evil.example/x"):
        p = proxied(lambda r, t=target: httpx.Response(302, headers={"location": t}))
        assert p.client.get(f"/i/{WID}/port/4444/go", follow_redirects=False).status_code == 502, target
    p = proxied(lambda r: httpx.Response(302, headers={"location": "/next"}))
    r = p.client.get(f"/i/{WID}/port/4444/go", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (302, f"/i/{WID}/port/4444/next")


def test_a_ticket_link_another_site_makes_the_browser_follow_is_refused(proxied: Any) -> None:
    """Login CSRF: an attacker's page navigates the victim's browser to the attacker's own ticket link, signing the
    victim in to the attacker's instance, whose pages then run on this origin with the victim's other sessions."""
    p = proxied(lambda r: httpx.Response(200))
    r = p.client.get(f"/i/{WID}/auth?ticket=" + "t" * 43, headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


def test_the_instance_is_not_told_the_browsers_credentials(proxied: Any) -> None:
    """A reverse proxy's Basic credentials (or any Authorization header) must not reach a tenant's service."""
    p = proxied(lambda r: httpx.Response(200))
    p.client.get(f"/i/{WID}/port/4444/", headers={"Authorization": "Basic b3BzOnNlY3JldA=="})
    assert p.seen and all("authorization" not in req.headers for req in p.seen)


def test_an_upstream_that_hangs_up_is_a_bad_gateway_not_a_crash(proxied: Any) -> None:
    """Error handling. A tenant's service (or one that restarted, leaving a dead keep-alive connection in the
    pool) that closes the connection without answering raises httpx.RemoteProtocolError/ReadError, which
    forward_http does not catch: an unhandled exception and a 500 with a traceback in the server log, every
    time the tenant asks."""

    def hang_up(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)

    p = proxied(hang_up)
    r = p.client.get(f"/i/{WID}/port/4444/")
    assert r.status_code in (502, 503, 504), (r.status_code, r.text)


def test_a_malformed_cookie_does_not_make_the_proxy_forward_its_session_cookie() -> None:
    """Session cookie leak to the instance. strip_cookie asks SimpleCookie whether the header holds the proxy's
    cookie; SimpleCookie gives up on the whole header at the first cookie it cannot parse (a value with a space,
    which browsers send as they got it, e.g. planted by the instance's own service), finds nothing, and the
    header, session secret included, goes to the upstream unchanged."""
    for header in ("bad=a b; suanli_proxy=SECRET", 'x="open; suanli_proxy=SECRET', "suanli_proxy=SECRET; y=1 2"):
        assert "SECRET" not in proxy_headers.strip_cookie(header), header


def test_the_jupyter_log_shown_on_the_503_page_is_not_followed_through_a_symlink(tmp_path: Path) -> None:
    """Arbitrary file read as root. The proxy directory is the tenant's (bound writable at /run/suanli-proxy); the
    503 page shows the last lines of its jupyter.log, read by the root server with a plain read_text. A tenant who
    runs `ln -s /proc/self/environ /run/suanli-proxy/jupyter.log` (or /etc/shadow, another tenant's files, the
    server's database) and opens /i/<mine>/lab/x while JupyterLab is not listening gets the server's
    environment (SUANLI_ADMIN_PASSWORD, the database URL) in the page."""
    secret = tmp_path / "root-only"
    secret.write_text("SUANLI_ADMIN_PASSWORD=hunter2\n")
    d = proxy.proxy_dir(tmp_path / "home", WID)
    d.mkdir(parents=True)
    (d / proxy.JUPYTER_LOG).symlink_to(secret)
    assert "hunter2" not in proxy.jupyter_log(tmp_path / "home", WID)


def test_a_fifo_as_the_jupyter_log_does_not_freeze_the_server(tmp_path: Path) -> None:
    """Denial of service of the whole server. `mkfifo /run/suanli-proxy/jupyter.log` in the instance, then open
    /i/<mine>/lab/x: the 503 page's jupyter_log() opens the FIFO, which blocks until a writer comes, and it is
    called from the async route (`_refused`), on the event loop every request shares. Demonstrated: /healthz
    stopped answering until the tenant opened the FIFO for writing. (A symlink to /dev/zero reads forever.)"""
    import threading

    d = proxy.proxy_dir(tmp_path / "home", WID)
    d.mkdir(parents=True)
    fifo = d / proxy.JUPYTER_LOG
    os.mkfifo(fifo)
    done = threading.Event()
    t = threading.Thread(target=lambda: (proxy.jupyter_log(tmp_path / "home", WID), done.set()), daemon=True)
    t.start()
    returned = done.wait(3)
    if not returned:  # let the blocked reader go
        with open(fifo, "w") as f:
            f.write("x\n")
        t.join(5)
    assert returned, "jupyter_log() blocked on a FIFO the tenant put in its place"


# ---- real sandboxes --------------------------------------------------------------------------------------------
SQUAT = r"""
import socket, sys, threading
P = int(sys.argv[1])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(("127.0.0.1", P)); ls.listen(16)
released = threading.Event()
def serve(c):
    while True:
        data = b""
        while b"\r\n\r\n" not in data:
            d = c.recv(65536)
            if not d:
                return
            data += d
        path = data.split(b" ")[1]
        body = b"MALLORY-INTERCEPTED\n" if released.is_set() else b"mallory\n"
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        if path.endswith(b"/release"):
            released.set(); ls.shutdown(socket.SHUT_RDWR); ls.close()  # the port is free; this connection stays in the proxy's pool
while True:
    try:
        c, _ = ls.accept()
    except OSError:
        threading.Event().wait()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
ECHO = r"""
import sys
from websockets.sync.server import serve
def echo(ws):
    for m in ws:
        ws.send(m)
with serve(echo, "127.0.0.1", int(sys.argv[1])) as s:
    s.serve_forever()
"""


@dataclass
class Sandboxes:
    srv: Any
    http: httpx.Client
    victim: Any
    mallory: Any
    insider: Any
    team: str
    squat_box: str
    victim_box: str
    port: int
    ws_port: int


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandboxes]:
    if shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"):
        pytest.skip("bubblewrap is not installed (apt install bubblewrap)")
    from tests.control_plane import admin_token, bearer, free_port, join, live_server, signup
    from tests.test_proxy_e2e import FAST, _submit, _wait_running

    tmp = tmp_path_factory.mktemp("proxy-attacks")
    port, ws_port = free_port(), free_port()
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'suanli.db'}", env=FAST) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).status_code == 201  # fmt: skip
        victim, mallory, insider = (signup(http, f"{n}@example.com") for n in ("victim", "mallory", "insider"))
        team = http.post("/api/v1/orgs", json={"name": "team"}, headers=victim.headers).json()["id"]
        for org in (team, mallory.org_id):
            r = http.post(
                f"/api/v1/admin/orgs/{org}/transactions", json={"kind": "topup", "amount": "100"}, headers=adm
            )
            assert r.status_code == 201, r.text
        join(http, victim, team, insider)
        squat = f"cat > /tmp/squat.py <<'EOF'\n{SQUAT}\nEOF\nexec python3 /tmp/squat.py {port}"
        squat_box = _submit(http, mallory, {"name": "squat", "kind": "instance", "command": squat, "ports": [port],
                                            "resources": {"gpus": 0}})  # fmt: skip
        _wait_running(http, mallory, squat_box)
        b = _signed_in(http, srv.url, mallory, squat_box, port)
        deadline = time.monotonic() + 30
        while b.get(f"/i/{squat_box}/port/{port}/ping").text != "mallory\n":  # Mallory holds the port first
            assert time.monotonic() < deadline
            time.sleep(0.3)
        # The victim's service takes its port as soon as it is free (a service that restarts, a fresh instance).
        serve = (f"mkdir -p s; echo victim-service > s/index.html; cat > /tmp/echo.py <<'EOF'\n{ECHO}\nEOF\n"
                 f"python3 /tmp/echo.py {ws_port} &\n"
                 f"until python3 -m http.server {port} --bind 127.0.0.1 --directory s; do sleep 0.1; done")  # fmt: skip
        r = http.post("/api/v1/workloads", headers=victim.headers, json={"org": team, "spec": {
            "name": "victim-box", "kind": "instance", "command": serve, "ports": [port, ws_port],
            "resources": {"gpus": 0}}})  # fmt: skip
        assert r.status_code == 201, r.text
        victim_box = r.json()["id"]
        _wait_running(http, victim, victim_box)
        try:
            yield Sandboxes(srv, http, victim, mallory, insider, team, squat_box, victim_box, port, ws_port)
        finally:  # instances outlive the server process: stop them
            for who, wid in ((mallory, squat_box), (victim, victim_box)):
                http.post(f"/api/v1/workloads/{wid}/stop", headers=who.headers)
            deadline = time.monotonic() + 30
            for who, wid in ((mallory, squat_box), (victim, victim_box)):
                while time.monotonic() < deadline and http.get(f"/api/v1/workloads/{wid}", headers=who.headers).json()[
                    "state"
                ] in ("running", "stopping"):
                    time.sleep(0.3)
            http.close()


def _signed_in(http: httpx.Client, url: str, who: Any, wid: str, port: int | None = None) -> httpx.Client:
    r = http.post(f"/api/v1/workloads/{wid}/proxy", json={"port": port} if port else {}, headers=who.headers)
    assert r.status_code == 200, r.text
    b = httpx.Client(base_url=url, timeout=30)
    assert b.get(r.json()["url"]).status_code == 200
    return b


def test_a_pooled_connection_to_a_port_is_not_reused_for_another_tenants_instance(sandboxes: Sandboxes) -> None:
    """Cross-tenant interception. The proxy checks that the workload's sandbox holds the listener, then sends
    through one shared httpx client whose keep-alive pool is keyed by 127.0.0.1:P only. Mallory serves a request
    on P through the proxy, closes her listener but keeps the accepted connection open; the victim's service
    then takes P and passes the ownership check, and the victim's requests (headers, bodies) go down Mallory's
    pooled connection and get her answers."""
    w = sandboxes
    mine = _signed_in(w.http, w.srv.url, w.mallory, w.squat_box, w.port)
    assert mine.get(f"/i/{w.squat_box}/port/{w.port}/release").status_code == 200
    victim = _signed_in(w.http, w.srv.url, w.victim, w.victim_box, w.port)
    deadline = time.monotonic() + 20  # its service takes the port within a second; the pool keeps Mallory's for 5 s
    while (r := victim.get(f"/i/{w.victim_box}/port/{w.port}/")).status_code == 503:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
    assert "MALLORY" not in r.text, "the victim's request went to Mallory's pooled connection"
    assert r.text == "victim-service\n", r.text


def test_a_websocket_ends_when_its_user_leaves_the_org(sandboxes: Sandboxes) -> None:
    """Access after revocation. A member removed from the org is refused on new requests within GRANT_TTL_S, but a
    WebSocket opened before (a JupyterLab kernel channel: code execution in the instance) is never re-checked and
    stays open indefinitely (demonstrated: a removed member still ran code in the kernel 15 s later)."""
    from websockets.sync.client import connect

    w = sandboxes
    b = _signed_in(w.http, w.srv.url, w.insider, w.victim_box, w.ws_port)
    cookie = "; ".join(f"{c.name}={c.value}" for c in b.cookies.jar)
    url = w.srv.url.replace("http://", "ws://") + f"/i/{w.victim_box}/port/{w.ws_port}/"
    deadline = time.monotonic() + 30
    while True:
        try:
            ws = connect(url, additional_headers={"Cookie": cookie}, open_timeout=10)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    with ws:  # closed however the test ends
        ws.send("before")
        assert ws.recv(timeout=10) == "before"
        r = w.http.delete(f"/api/v1/orgs/{w.team}/members/{w.insider.user_id}", headers=w.victim.headers)
        assert r.status_code == 204, r.text
        time.sleep(api_proxy.GRANT_TTL_S + 3)
        assert b.get(f"/i/{w.victim_box}/port/{w.ws_port}/").status_code == 403  # HTTP: out, as documented
        still_open = True
        try:
            ws.send("after")
            still_open = ws.recv(timeout=5) == "after"
        except Exception:
            still_open = False
        assert not still_open, "a removed member's WebSocket still reaches the instance"
