"""Workloads end to end on a real server process (its own scheduling loop, supervisor and metering), over real
HTTP, on SQLite and PostgreSQL: real jobs on the local executor, a torch.distributed gloo rendezvous, virtual
GPU gangs, and the server killed with SIGKILL mid-run and restarted."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from suanli.billing.metering import billable_seconds, cost_of
from tests.control_plane import LiveServer, admin_token, bearer, live_server, signup
from tests.test_workloads_api import archive

FAST = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "SUANLI_STOP_GRACE_S": "2"}
TERMINAL = ("succeeded", "failed", "stopped", "preempted")


class Api:
    def __init__(self, server: LiveServer) -> None:
        self.http = httpx.Client(base_url=server.url, timeout=30)
        self.admin = bearer(admin_token(self.http))
        self.tenant = signup(self.http, "tenant@example.com")

    def submit(self, spec: dict[str, Any], **extra: Any) -> str:
        r = self.http.post("/api/v1/workloads", json={"spec": spec, **extra}, headers=self.tenant.headers)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def get(self, ref: str) -> dict[str, Any]:
        r = self.http.get(f"/api/v1/workloads/{ref}", headers=self.tenant.headers)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def until(self, ref: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            w = self.get(ref)
            if done(w):
                return w
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out: {w['state']} {w['reason']} {w.get('pending')}")
            time.sleep(0.1)

    def logs(self, ref: str) -> str:
        out, offset = [], 0
        while True:
            chunk = self.http.get(f"/api/v1/workloads/{ref}/logs", params={"offset": offset},
                                  headers=self.tenant.headers).json()  # fmt: skip
            out.append(chunk["data"])
            offset = chunk["next_offset"]
            if chunk["done"]:
                return "".join(out)
            time.sleep(0.1)

    def setup(self, top_up: str = "5000") -> None:
        for body in ({"preset": "h20-roce800-128"}, {"local": True, "name": "this-host"}):
            r = self.http.post("/api/v1/admin/clusters", json=body, headers=self.admin)
            assert r.status_code == 201, r.text
        r = self.http.post(f"/api/v1/admin/orgs/{self.tenant.org_id}/transactions", headers=self.admin,
                           json={"kind": "topup", "amount": top_up})  # fmt: skip
        assert r.status_code == 201, r.text

    def usage_charged(self) -> Decimal:
        tx = self.http.get(f"/api/v1/orgs/{self.tenant.org_id}/transactions", headers=self.tenant.headers,
                           params={"limit": 1000}).json()  # fmt: skip
        # usage, less what settling gave back of windows charged past a run's end
        net = [t for t in tx if t["kind"] == "usage" or t["key"].startswith("usage-credit:")]
        return -sum((Decimal(t["amount"]) for t in net), Decimal(0))


@contextmanager
def server(tmp_path: Path, db_url: str) -> Iterator[LiveServer]:
    with live_server(tmp_path / "home", db_url, env=FAST) as srv:
        yield srv


def exact_cost(w: dict[str, Any]) -> Decimal:
    from datetime import datetime

    a = w["allocation"]
    span = datetime.fromisoformat(a["stopped_at"]) - datetime.fromisoformat(a["started_at"])
    return cost_of(Decimal(a["rate_per_hour"]), billable_seconds(span.total_seconds(), True))


def settled(api: Api, expected: Decimal, timeout: float = 30.0) -> Decimal:
    deadline = time.monotonic() + timeout
    while (charged := api.usage_charged()) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return charged


CHECK_ENV = """\
import os, pathlib, sys
keys = ["SUANLI_WORKLOAD_ID", "SUANLI_NODE", "SUANLI_NODES", "WORLD_SIZE", "RANK", "CUDA_VISIBLE_DEVICES", "EPOCHS",
        "SUANLI_ADMIN_PASSWORD", "SUANLI_HOME"]
pathlib.Path("env.txt").write_text("\\n".join(f"{k}={os.environ.get(k)}" for k in keys))
print("checked", os.environ["SUANLI_WORKLOAD_ID"], flush=True)
print("to stderr", file=sys.stderr, flush=True)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def test_real_jobs_run_to_completion_with_logs_exit_codes_events_and_exact_charges(tmp_path: Path, db_url: str) -> None:
    with server(tmp_path, db_url) as srv:
        api = Api(srv)
        api.setup()
        ok = api.submit({"name": "check-env", "command": "python3 check.py", "env": {"EPOCHS": "3"},
                         "resources": {"gpus": 0}}, workdir_archive=archive({"check.py": CHECK_ENV}))  # fmt: skip
        bad = api.submit({"name": "exit-7", "command": "python3 check.py", "env": {"EXIT": "7"},
                          "resources": {"gpus": 0}}, workdir_archive=archive({"check.py": CHECK_ENV}))  # fmt: skip
        gang = api.submit({"name": "gang", "command": "train", "duration": 2,
                           "resources": {"gpu": "H20", "gpus": 16, "topology": "leaf"}})  # fmt: skip
        done = api.until(ok, lambda w: w["state"] in TERMINAL)
        assert done["state"] == "succeeded" and done["exit_code"] == 0
        assert api.logs(ok) == f"checked {ok}\nto stderr\n"
        written = (srv.home / "workloads" / ok / "workdir" / "env.txt").read_text().splitlines()
        assert written == [f"SUANLI_WORKLOAD_ID={ok}", "SUANLI_NODE=this-host", "SUANLI_NODES=1", "WORLD_SIZE=1",
                           "RANK=0", "CUDA_VISIBLE_DEVICES=", "EPOCHS=3",
                           "SUANLI_ADMIN_PASSWORD=None", "SUANLI_HOME=None"]  # the server's settings stay its own  # fmt: skip
        failed = api.until(bad, lambda w: w["state"] in TERMINAL)
        assert failed["state"] == "failed" and failed["exit_code"] == 7 and "exit code 7" in failed["reason"]
        g = api.until(gang, lambda w: w["state"] in TERMINAL)
        assert g["state"] == "succeeded"
        assert [e["state"] for e in g["events"]] == ["pending", "scheduled", "starting", "running", "succeeded"]
        assert len(g["allocation"]["nodes"]) == 2  # 16 H20 = two whole 8-GPU nodes (one NVLink domain each)
        assert Decimal(g["cost"]) == exact_cost(g) > 0
        done, failed = api.get(ok), api.get(bad)
        assert exact_cost(done) > 0 and exact_cost(failed) > 0  # CPU-only work pays its cores and memory
        total = exact_cost(g) + exact_cost(done) + exact_cost(failed)
        assert settled(api, total) == total
        check = api.http.get("/api/v1/admin/ledger/check", headers=api.admin).json()
        assert check["ok"], check


TRAIN = """\
import os, pathlib
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
if rank == 0:
    pathlib.Path("result.txt").write_text(f"{world} {t.item():g}")
print(f"rank {rank}/{world} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_a_multi_rank_job_rendezvouses_through_torch_distributed_gloo(tmp_path: Path, db_url: str) -> None:
    pytest.importorskip("torch")
    with server(tmp_path, db_url) as srv:
        api = Api(srv)
        api.setup()
        command = ("python3 -m torch.distributed.run --nnodes $SUANLI_NODES --node-rank $NODE_RANK "
                   "--nproc-per-node 3 --master-addr $MASTER_ADDR --master-port $MASTER_PORT train.py")  # fmt: skip
        wid = api.submit({"name": "ddp", "command": command, "env": {"GLOO_SOCKET_IFNAME": "lo"},
                          "resources": {"gpus": 0}}, workdir_archive=archive({"train.py": TRAIN}))  # fmt: skip
        done = api.until(wid, lambda w: w["state"] in TERMINAL, timeout=120)
        assert done["state"] == "succeeded", api.logs(wid)
        assert (srv.home / "workloads" / wid / "workdir" / "result.txt").read_text() == "3 6"  # 1 + 2 + 3
        assert "rank 0/3 sum 6" in api.logs(wid)


def test_the_server_killed_mid_run_re_attaches_and_bills_exactly(tmp_path: Path, db_url: str) -> None:
    home = tmp_path / "home"
    with live_server(home, db_url, env=FAST) as srv:
        api = Api(srv)
        api.setup()
        survivor = api.submit({"name": "survivor", "command": "sleep 3; echo survived", "resources": {"gpus": 0}})
        quick = api.submit({"name": "quick", "command": "sleep 1; exit 4", "resources": {"gpus": 0}})
        gang = api.submit({"name": "gang", "command": "x", "duration": 4, "resources": {"gpu": "H20", "gpus": 32}})
        for wid in (survivor, quick, gang):
            api.until(wid, lambda w: w["state"] == "running")
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
        tenant = api.tenant
    time.sleep(2)  # `quick` ends while no server watches
    with live_server(home, db_url, env=FAST) as srv2:
        api2 = Api.__new__(Api)
        api2.http = httpx.Client(base_url=srv2.url, timeout=30)
        api2.admin = bearer(admin_token(api2.http))
        api2.tenant = tenant
        s = api2.until(survivor, lambda w: w["state"] in TERMINAL)
        assert s["state"] == "succeeded" and api2.logs(survivor).strip() == "survived"
        q = api2.until(quick, lambda w: w["state"] in TERMINAL)
        assert q["state"] == "failed" and q["exit_code"] == 4
        g = api2.until(gang, lambda w: w["state"] in TERMINAL)
        assert g["state"] == "succeeded"
        # exactly the seconds each held its GPUs or cores: launched before the crash, ended after it
        total = exact_cost(g) + exact_cost(s) + exact_cost(q)
        assert settled(api2, total) == total
        held = (_t(g["allocation"]["stopped_at"]) - _t(g["allocation"]["started_at"])).total_seconds()
        assert 4 <= held < 6
        every = api2.http.get("/api/v1/workloads", params={"all": True}, headers=tenant.headers).json()
        assert sorted(w["name"] for w in every) == ["gang", "quick", "survivor"]  # none lost, none duplicated
        assert all(w["attempt"] == 1 for w in every)
        check = api2.http.get("/api/v1/admin/ledger/check", headers=api2.admin).json()
        assert check["ok"], check
    assert not _alive_children(home)


def _t(s: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(s)


def _alive_children(home: Path) -> list[int]:
    """Supervisor processes of workloads under `home` still running (none should be, once all ended)."""
    alive = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"suanli.executors.rankrun" in cmd and str(home).encode() in cmd:
            alive.append(pid)
    return alive


def test_one_server_leads_the_loop_and_another_takes_over_when_it_dies(tmp_path: Path, db_url: str) -> None:
    with live_server(tmp_path / "a", db_url, env=FAST) as a, live_server(tmp_path / "b", db_url, env=FAST) as b:
        api = Api(a)
        r = api.http.post("/api/v1/admin/clusters", json={"preset": "h20-roce800-128"}, headers=api.admin)
        assert r.status_code == 201, r.text
        api.http.post(f"/api/v1/admin/orgs/{api.tenant.org_id}/transactions", headers=api.admin,
                      json={"kind": "topup", "amount": "1000"}).raise_for_status()  # fmt: skip
        loops = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            loops = {srv.url: httpx.get(f"{srv.url}/api/v1/admin/workloads/summary", headers=api.admin).json()["loop"]
                     for srv in (a, b)}  # fmt: skip
            if any(x["this_process"] for x in loops.values()):
                break
            time.sleep(0.2)
        leaders = [srv for srv in (a, b) if loops[srv.url]["this_process"]]
        assert len(leaders) == 1, loops
        assert loops[a.url]["leader"] == loops[b.url]["leader"]
        leader = leaders[0]
        other = b if leader is a else a
        via_other = Api.__new__(Api)
        via_other.http, via_other.admin, via_other.tenant = httpx.Client(base_url=other.url), api.admin, api.tenant
        first = via_other.submit({"name": "one", "command": "x", "duration": 1, "resources": {"gpu": "H20", "gpus": 8}})
        assert via_other.until(first, lambda w: w["state"] in TERMINAL)["state"] == "succeeded"
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait()
        second = via_other.submit(
            {"name": "two", "command": "x", "duration": 1, "resources": {"gpu": "H20", "gpus": 8}}
        )
        done = via_other.until(second, lambda w: w["state"] in TERMINAL, timeout=60)
        assert done["state"] == "succeeded"
        loop = httpx.get(f"{other.url}/api/v1/admin/workloads/summary", headers=api.admin).json()["loop"]
        assert loop["this_process"] and loop["passes"] > 0
