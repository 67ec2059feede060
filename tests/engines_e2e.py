"""What the end-to-end engine tests share: a `suanli server` on an engine (Ray or Slurm), tenants, a 2-node
torch.distributed (gloo) job, and waiting on what the API says.

The job all-reduces a tensor holding each rank's RANK+1 across both node-ranks and prints the sum, the node it ran
on (as suanli names it) and its world size, so a test checks the collective, the placement and the
environment from the logs alone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

import httpx

from suanli.billing.metering import billable_seconds
from tests.control_plane import LiveServer, Tenant, live_server

GLOO = r"""python3 - <<'EOF'
import datetime, os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item():g} node={os.environ['SUANLI_NODE']} "
      f"cuda={os.environ.get('CUDA_VISIBLE_DEVICES')} restart={os.environ.get('SUANLI_RESTART_REASON', '')}", flush=True)
dist.destroy_process_group()
EOF"""
HOLD = "sleep 600"  # a job that runs until it is stopped or its node dies


def gloo_spec(name: str, gpus: int = 16, command: str = GLOO, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": command, "resources": {"gpu": "H100", "gpus": gpus},
            "retry": {"on": ["node-failure"], "limit": 3}, **extra}  # fmt: skip


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 120.0,
    every: float = 0.3,
    why: Callable[[], Any] | None = None,
) -> Any:
    """Poll `check` until it is truthy; on timeout the assertion shows its last answer (and `why()`, if given)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    more = f"; {why()!r}" if why is not None else ""
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r}){more}")


def workload(http: httpx.Client, who: Tenant, wid: str) -> dict[str, Any]:
    r = http.get(f"/api/v1/workloads/{wid}", headers=who.headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


def logs(http: httpx.Client, who: Tenant, wid: str, rank: int) -> str:
    r = http.get(f"/api/v1/workloads/{wid}/logs", params={"rank": rank, "limit": 1 << 20}, headers=who.headers)
    assert r.status_code == 200, r.text
    return str(r.json()["data"])


def engine_nodes(http: httpx.Client, admin: dict[str, str], cluster: str) -> list[dict[str, Any]]:
    r = http.get("/api/v1/admin/nodes", params={"cluster": cluster}, headers=admin)
    assert r.status_code == 200, r.text
    return list(r.json())


def rank_lines(text: str) -> dict[str, str]:
    """`key=value` pairs of the job's result line in a rank's log."""
    for line in text.splitlines():
        if line.startswith("rank="):
            return dict(part.split("=", 1) for part in line.split())
    return {}


class EngineWorld(Protocol):
    """What the engine e2e modules' worlds hold: a live server on the engine, its database, a paying tenant."""

    db: str
    srv: LiveServer
    http: httpx.Client
    admin: dict[str, str]
    tenant: Tenant

    def env(self) -> dict[str, str]: ...


def submit(w: EngineWorld, spec: dict[str, Any]) -> str:
    r = w.http.post("/api/v1/workloads", json={"spec": spec}, headers=w.tenant.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def nodes_of(doc: dict[str, Any]) -> list[str]:
    """The nodes of the workload's allocation, in node-rank order."""
    return list((doc.get("allocation") or {}).get("nodes") or {})


def check_node_kill(w: EngineWorld, cluster: str, kill: Callable[[str], Any], restart: Callable[[str], Any],
                    gpus: int = 16) -> None:  # fmt: skip
    """A node killed mid-run: within 30 s (plus the engine's own detection, `grace`) the job runs again on other
    nodes, the node is down with the engine's reason, the tenant is credited; the node comes back ready."""
    wid = submit(w, gloo_spec("survivor", gpus=gpus, command=HOLD))
    first = wait_for("it to run", lambda: (d := workload(w.http, w.tenant, wid))["state"] == "running" and d)
    victim = nodes_of(first)[0]
    kill(victim.removeprefix(f"{cluster}."))
    deadline = time.monotonic() + 30 + NODE_DETECTION_S[cluster]
    try:
        again = wait_for("it to run again elsewhere",
                         lambda: (d := workload(w.http, w.tenant, wid))["state"] == "running"
                         and d["attempt"] > first["attempt"] and d, timeout=deadline - time.monotonic(),
                         why=lambda: workload(w.http, w.tenant, wid)["events"])  # fmt: skip
        assert victim not in nodes_of(again), (victim, nodes_of(again))
        events = " | ".join(e["reason"] for e in again["events"])
        assert "credited" in events, events
        # The job may run again (its rank failed) before the node sync has read the engine's verdict on the node:
        # the node must be down within the same bound, not necessarily first (a loaded CI machine saw it 'ready').
        down = wait_for("the node down with the engine's reason",
                        lambda: (n := {n["name"]: n for n in engine_nodes(w.http, w.admin, cluster)}[victim])["state"]
                        == "down" and n, timeout=max(1.0, deadline - time.monotonic()))  # fmt: skip
        assert down["state_reason"].startswith(f"{cluster}: "), down
    finally:
        w.http.post(f"/api/v1/workloads/{wid}/stop", headers=w.tenant.headers)
        restart(victim.removeprefix(f"{cluster}."))
    wait_for("the node back in service under its name", lambda: {n["name"]: n["state"] for n in
             engine_nodes(w.http, w.admin, cluster)}[victim] == "ready", timeout=60)  # fmt: skip


# How long the engine takes to call a killed node dead in the test clusters: Ray's health checks (1 s x 3), and
# Slurm's SlurmdTimeout=5 s with MessageTimeout=3 s (about 12 s, measured).
NODE_DETECTION_S = {"ray": 5.0, "slurm": 20.0}


def check_server_kill(w: EngineWorld) -> LiveServer:
    """The server SIGKILLed while a job runs and started again: the running attempt is found again (not lost, not
    run twice), it finishes, it is charged for the time it held its GPUs, and the ledger balances. Returns the new
    server (stopped when this returns: the caller's module has no test after this one)."""
    wid = submit(w, gloo_spec("long", command="sleep 8; echo finished-after-restart"))
    running = wait_for("it to run", lambda: (d := workload(w.http, w.tenant, wid))["state"] == "running" and d)
    os.kill(w.srv.proc.pid, signal.SIGKILL)
    w.srv.proc.wait()
    with live_server(w.srv.home, w.db, env=w.env()) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        doc = wait_for("it to finish after the restart", lambda: (d := workload(http, w.tenant, wid))["state"]
                       in ("succeeded", "failed", "lost") and d, timeout=90)  # fmt: skip
        assert doc["state"] == "succeeded" and doc["attempt"] == running["attempt"], doc["reason"]  # not run twice
        assert "finished-after-restart" in logs(http, w.tenant, wid, 0)
        alloc = doc["allocation"]
        held = (_parse(alloc["stopped_at"]) - _parse(alloc["started_at"])).total_seconds()
        assert 7 <= held <= 30, held
        assert Decimal(doc["cost"]) > 0
        r = http.get("/api/v1/admin/ledger/check", headers=w.admin)
        assert r.status_code == 200 and r.json()["ok"], r.text
        http.close()
    return srv


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_charged_by_the_second(w: EngineWorld, doc: dict[str, Any]) -> None:
    """What the ledger charged for the finished workload, through the metering loop: its whole seconds held, at its
    rate, to the unit of 1e-8, and what `describe` says it cost."""
    alloc = doc["allocation"]
    held = (_parse(alloc["stopped_at"]) - _parse(alloc["started_at"])).total_seconds()

    def row() -> dict[str, Any] | None:
        r = w.http.get(
            f"/api/v1/orgs/{w.tenant.org_id}/usage", params={"workload": doc["id"]}, headers=w.tenant.headers
        )
        assert r.status_code == 200, r.text
        rows = [x for x in r.json() if x["allocation"] == alloc["id"]]
        return rows[0] if rows and Decimal(rows[0]["cost"]) == Decimal(doc["cost"]) else None

    charged = wait_for("the metering loop to charge it", row, timeout=30)
    seconds = int(charged["seconds_charged"])
    assert seconds == billable_seconds(held, True) and seconds > 0, (seconds, held)  # to the nearest second, once
    assert Decimal(charged["cost"]) == (Decimal(alloc["rate_per_hour"]) * seconds / 3600).quantize(Decimal("1e-8"))
