"""Starting JupyterLab on demand cannot starve the server's route threads (found by a hostile review; a `suanli
server` process, real bubblewrap sandboxes, default settings).

`POST /workloads/{ref}/proxy` on an instance not started with `jupyter: true` starts JupyterLab in its sandbox from
a route thread (8 by default). The start backgrounded `jupyter lab ... >"$SUANLI_PROXY_DIR/jupyter.log" 2>&1`, and
the proxy directory is the tenant's: with `mkfifo /run/suanli-proxy/jupyter.log` the backgrounded shell blocked
opening the FIFO while it held the server's stderr pipe, so each call held a thread for the full 30 s timeout, as
often as asked. With 8 cheap CPU instances another tenant's `GET /api/v1/workloads` took 27 s. Now the background
job lets go of the server's descriptors before it opens the log, and one server process runs at most
`STARTS_AT_ONCE` starts at once (503 with Retry-After for more).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from suanli.control.workloads import proxy
from tests.control_plane import admin_token, bearer, live_server, signup
from tests.test_proxy_e2e import FAST, _submit, _wait_running

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed",
)
THREADS = 8  # Settings.threads' default
FIFO_BOX = "mkfifo /run/suanli-proxy/jupyter.log; touch /tmp/ready; exec sleep 600"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fifo")
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'suanli.db'}", env=FAST) as srv:
        http = httpx.Client(base_url=srv.url, timeout=120)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).status_code == 201  # fmt: skip
        mallory, victim = signup(http, "mallory@example.com"), signup(http, "victim@example.com")
        r = http.post(f"/api/v1/admin/orgs/{mallory.org_id}/transactions", json={"kind": "topup", "amount": "100"},
                      headers=adm)  # fmt: skip
        assert r.status_code == 201, r.text
        boxes = [_submit(http, mallory, {"name": f"fifo-{i}", "kind": "instance", "command": FIFO_BOX,
                                         "resources": {"gpus": 0}}) for i in range(THREADS)]  # fmt: skip
        for wid in boxes:
            _wait_running(http, mallory, wid)
        time.sleep(2)  # each has made its FIFO
        try:
            yield {"srv": srv, "http": http, "mallory": mallory, "victim": victim, "boxes": boxes}
        finally:
            for wid in boxes:
                http.post(f"/api/v1/workloads/{wid}/stop", headers=mallory.headers)
            deadline = time.monotonic() + 60
            for wid in boxes:
                while time.monotonic() < deadline and http.get(f"/api/v1/workloads/{wid}",
                                                               headers=mallory.headers).json()["state"] == "running":  # fmt: skip
                    time.sleep(0.3)
            http.close()


def test_opening_jupyter_cannot_pin_the_servers_route_threads(world: dict[str, Any]) -> None:
    srv, http, mallory, victim = world["srv"], world["http"], world["mallory"], world["victim"]
    t0 = time.monotonic()
    assert http.get("/api/v1/workloads", headers=victim.headers).status_code == 200
    baseline = time.monotonic() - t0
    results: dict[str, tuple[int, float]] = {}

    def open_lab(wid: str) -> None:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            s = time.monotonic()
            r = c.post(f"/api/v1/workloads/{wid}/proxy", json={}, headers=mallory.headers)
            results[wid] = (r.status_code, time.monotonic() - s)

    threads = [threading.Thread(target=open_lab, args=(wid,)) for wid in world["boxes"]]
    for t in threads:
        t.start()
    time.sleep(3)  # every POST is now inside ensure_jupyter
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        s = time.monotonic()
        r = c.get("/api/v1/workloads", headers=victim.headers)
        waited = time.monotonic() - s
    for t in threads:
        t.join(120)
    slow = {wid: v for wid, v in results.items() if v[1] > 20}
    assert waited < 5, (
        f"another tenant's GET /api/v1/workloads took {waited:.1f} s (baseline {baseline:.2f} s, status "
        f"{r.status_code}) while Mallory's {len(slow)} POST /proxy calls each held a route thread: {results}"
    )
    assert not slow and {code for code, _ in results.values()} <= {200, 503}, results


def test_the_background_start_lets_go_of_its_starters_pipe_before_it_opens_the_log(tmp_path: Path) -> None:
    """The command itself, outside any sandbox: with the log a FIFO nobody reads, the starter's stderr pipe is at
    EOF as soon as the shell has put the job in the background (it was held until the FIFO opened: never)."""
    os.mkfifo(tmp_path / proxy.JUPYTER_LOG)
    (tmp_path / "jupyter").write_text("#!/bin/sh\nexec sleep 30\n")
    (tmp_path / "jupyter").chmod(0o755)
    env = {**os.environ, "SUANLI_PROXY_DIR": str(tmp_path), "SUANLI_WORKLOAD_ID": "wl_x",
           "PATH": f"{tmp_path}:{os.environ['PATH']}"}  # fmt: skip
    done = subprocess.run(["/bin/sh", "-c", proxy.JUPYTER_BACKGROUND], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=20, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with open(tmp_path / proxy.JUPYTER_LOG, "rb") as fifo:  # the job, still waiting for a reader, goes on
        pass
    del fifo
