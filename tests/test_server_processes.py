"""Several server processes on one database: start-up work (migrations, seeding, the first admin, virtual
nodes) happens once, and the processes serve the same state."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import httpx

from tests.control_plane import admin_token, bearer, children, cmdline, live_server, signup, spawned
from tests.web_helpers import Console


def test_workers_starting_together_bootstrap_once_and_share_state(db_url: str, tmp_path: Path) -> None:
    args = ("--workers", "3", "--virtual", "4x8:H100")
    env = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2"}
    with (
        live_server(tmp_path / "home", db_url, args=args, env=env) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        admin = bearer(admin_token(c))
        users = c.get("/api/v1/admin/users", headers=admin).json()
        assert [u["email"] for u in users] == ["ops@example.com"]
        clusters = c.get("/api/v1/admin/clusters", headers=admin).json()
        assert [(x["name"], x["gpus"]) for x in clusters] == [("4x8:H100-SXM", 32)]
        assert c.get("/api/v1/prices", headers=admin).json()["version"] == 1
        # Requests land on different workers; every one sees the tenant the first one created.
        t = signup(c, "t@example.com")
        for _ in range(12):
            r = httpx.get(f"{srv.url}/api/v1/orgs/{t.org_id}/balance", headers=t.headers, timeout=30)
            assert r.status_code == 200 and r.json()["balance"] == "10.00"
        # The background loops run once, beside the workers: three workers and one loop process.
        assert len(spawned(srv.proc.pid)) == 4, [cmdline(k) for k in children(srv.proc.pid)]
        # ... and they run: a job submitted through any worker is placed and runs on the virtual nodes.
        spec = {"name": "w", "command": "train", "duration": 600, "resources": {"gpu": "H100-SXM", "gpus": 1}}
        r = c.post("/api/v1/workloads", headers=t.headers, json={"spec": spec})
        assert r.status_code == 201, r.text
        wid = r.json()["id"]
        deadline = time.monotonic() + 30
        while (state := c.get(f"/api/v1/workloads/{wid}", headers=t.headers).json()["state"]) != "running":
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        # A console form's secret is shown on the page its redirect leads to, whichever worker answers that GET
        # (every request on a new connection, so they spread over the workers).
        fresh = httpx.Client(base_url=srv.url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0))
        with fresh:
            web = Console(fresh)
            web.signup("console@example.com")
            for n in range(6):
                assert (
                    web.post(
                        "/keys/tokens", {"name": f"w{n}", "password": "tenant-password"}, csrf_from="/keys"
                    ).status_code
                    == 303
                )
                page = web.get("/keys").text
                shown = re.search(r'id="token-secret">([^<]+)<', page)
                assert shown and 'id="once-lost"' not in page, (n, page[-800:])
                assert c.get("/api/v1/me", headers=bearer(shown.group(1))).status_code == 200
        loop = c.get("/api/v1/admin/workloads/summary", headers=admin).json()["loop"]
        assert loop["this_process"], loop  # whichever worker answers: the loop is this server's
        # The loop process is started again when it dies.
        leader_pid = int(loop["leader"].split("/")[1].split(":")[0])
        assert leader_pid in children(srv.proc.pid)
        os.kill(leader_pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while leader_pid in children(srv.proc.pid) or len(spawned(srv.proc.pid)) < 4:
            assert time.monotonic() < deadline, spawned(srv.proc.pid)
            time.sleep(0.2)
    assert "Traceback" not in srv.log.read_text(errors="replace")


def test_workers_slow_to_start_are_waited_for_not_killed(tmp_path: Path) -> None:
    """uvicorn kills a worker that has not answered its health ping within 5 s unless told otherwise, and a worker
    answers only once it has imported the app, which on a busy host takes longer: the server then killed and
    respawned its workers forever. Here every worker takes over 6 s to start."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys, time\nif '--multiprocessing-fork' in sys.argv:\n    time.sleep(6)\n"
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    args = ("--workers", "2", "--no-background")
    with live_server(tmp_path / "home", f"sqlite:///{tmp_path}/s.db", args=args, env={"PYTHONPATH": path}) as srv:
        assert httpx.get(f"{srv.url}/healthz", timeout=10).status_code == 200
        assert len(spawned(srv.proc.pid)) == 2
    assert "died" not in srv.log.read_text(errors="replace")


def test_the_loop_process_stops_in_order_however_many_sigterms_come(tmp_path: Path) -> None:
    """Its SIGTERM handler set a threading.Event: SIGTERMs arriving while an earlier handler waited for the event's
    lock nested handlers until the process died of a RecursionError (its leases left to run out), or deadlocked it,
    and its loops ran on (as an orphan, once its server was killed). Now it stops in order: it releases the loop's
    lease, so the loop process started in its place leads at once."""
    env = {"SUANLI_SCHEDULE_INTERVAL_S": "5"}  # the loop's lease lasts 50 s: a leader within 40 s was handed it
    with (
        live_server(tmp_path / "home", f"sqlite:///{tmp_path}/s.db", env=env) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        admin = bearer(admin_token(c))

        def leader() -> int | None:
            loop = c.get("/api/v1/admin/workloads/summary", headers=admin).json()["loop"]
            return int(loop["leader"].split("/")[1].split(":")[0]) if loop["this_process"] else None

        deadline = time.monotonic() + 60
        while (pid := leader()) is None:
            assert time.monotonic() < deadline, "the loop never led"
            time.sleep(0.2)
        storm = time.monotonic() + 5  # back to back, until it exits: many arrive while an earlier handler runs
        while time.monotonic() < storm and proc_state(pid) not in ("Z", None):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 40
        while leader() in (None, pid):
            assert time.monotonic() < deadline, f"no new leader: the old loop process is {proc_state(pid)}"
            time.sleep(0.2)
    assert "Traceback" not in srv.log.read_text(errors="replace")


def proc_state(pid: int) -> str | None:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
