"""What the end-to-end engine tests share: a `suanli server` on an engine (Ray or Slurm), tenants, a 2-node
torch.distributed (gloo) job, and waiting on what the API says.

The job all-reduces a tensor holding each rank's RANK+1 across both node-ranks and prints the sum, the node it ran
on (as suanli names it) and its world size, so a test checks the collective, the placement and the
environment from the logs alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.control_plane import Tenant

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


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


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
