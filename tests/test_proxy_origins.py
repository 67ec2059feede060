"""One origin per instance (`proxy_url: http://{id}.DOMAIN`): a real server and sandboxed instances; the link leads
to the instance's own host, where only that instance's pages are served; `/i/` on the server's own host, another
instance's pages on this instance's host, and the API on an instance's host are all not found. (Name resolution
of the wildcard domain is the operator's DNS: the test sends the Host header itself.)"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.control_plane import admin_token, bearer, free_port, live_server, signup
from tests.test_proxy_e2e import FAST, _submit, _wait_running

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)
DOMAIN = "inst.test"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    tmp = tmp_path_factory.mktemp("proxy-origins")
    port = free_port()
    env = {**FAST, "SUANLI_PROXY_URL": f"http://{{id}}.{DOMAIN}"}
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'suanli.db'}", env=env) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).status_code == 201  # fmt: skip
        tenant = signup(http, "tenant@example.com")
        r = http.post(f"/api/v1/admin/orgs/{tenant.org_id}/transactions", json={"kind": "topup", "amount": "100"},
                      headers=adm)  # fmt: skip
        assert r.status_code == 201, r.text
        serve = f"echo own-origin > hello.txt; exec python3 -m http.server {port} --bind 127.0.0.1"
        box = _submit(http, tenant, {"name": "box", "kind": "instance", "command": serve, "ports": [port],
                                     "resources": {"gpus": 0}})  # fmt: skip
        other = _submit(http, tenant, {"name": "other", "kind": "instance", "resources": {"gpus": 0}})
        for wid in (box, other):
            _wait_running(http, tenant, wid)
        try:
            yield {"srv": srv, "http": http, "tenant": tenant, "box": box, "other": other, "port": port}
        finally:  # instances outlive the server process: stop them
            for wid in (box, other):
                http.post(f"/api/v1/workloads/{wid}/stop", headers=tenant.headers)
            deadline = time.monotonic() + 30
            for wid in (box, other):
                while time.monotonic() < deadline and http.get(f"/api/v1/workloads/{wid}",
                                                               headers=tenant.headers).json()["state"] == "running":  # fmt: skip
                    time.sleep(0.3)
            http.close()


def _on(world: dict[str, object], host: str) -> httpx.Client:
    srv = world["srv"]
    return httpx.Client(base_url=srv.url, headers={"Host": host}, timeout=30)  # type: ignore[attr-defined]


def test_the_link_leads_to_the_instances_own_origin_and_only_it_serves_there(world: dict[str, object]) -> None:
    http, tenant, box, port = world["http"], world["tenant"], world["box"], world["port"]
    r = http.post(f"/api/v1/workloads/{box}/proxy", json={"port": port}, headers=tenant.headers)  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    link = urlsplit(r.json()["url"])
    host = f"{box.replace('_', '-')}.{DOMAIN}"  # type: ignore[attr-defined]
    assert (link.scheme, link.netloc) == ("http", host)
    b = _on(world, host)
    page = b.get(f"{link.path}?{link.query}")
    assert page.status_code == 200, page.text
    assert "domain=" not in page.headers["set-cookie"].lower()  # host-only: the instance's origin alone
    deadline = time.monotonic() + 30
    while (got := b.get(f"/i/{box}/port/{port}/hello.txt")).status_code == 503:
        assert time.monotonic() < deadline, got.text
        time.sleep(0.3)
    assert (got.status_code, got.text) == (200, "own-origin\n")
    # The server's own host serves no instance pages; this instance's host serves no other instance, and no API.
    assert _on(world, urlsplit(world["srv"].url).netloc).get(f"/i/{box}/port/{port}/hello.txt").status_code == 404  # type: ignore[attr-defined]
    assert b.get(f"/i/{world['other']}/lab/api/status").status_code == 404
    assert b.get("/api/v1/me", headers={"Authorization": f"Bearer {tenant.token}"}).status_code == 404  # type: ignore[attr-defined]
    assert _on(world, f"wl-zz.{DOMAIN}").get(f"/i/{box}/lab/").status_code == 404
