"""A shrink and a grow carried out end to end on the local executor, on both databases: real processes (one per
node-rank, sandboxed) on two `local` nodes with four fake GPUs each see their new world size and GPUs and
`SUANLI_RESTART_REASON=resize`; the attempt stopped for the resize gets SIGTERM and its clean exit counts for
nothing; billing splits exactly at each resize; no retry is spent."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from suanli.billing.metering import cost_of
from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.db.models import Allocation, Node, Workload
from suanli.storage import workdirs
from tests.test_resize_virtual import API, Cluster, make_cluster
from tests.test_workloads_api import archive

TRAIN = """\
import os, signal, sys, time
e = os.environ
print("env", e["WORLD_SIZE"], e["NODE_RANK"], e["CUDA_VISIBLE_DEVICES"], e.get("SUANLI_RESTART_REASON", "-"),
      e["SUANLI_ATTEMPT"], flush=True)

def checkpoint(*_):
    print("checkpoint", flush=True)
    sys.exit(0)  # a clean exit after SIGTERM: the resize's stop, not the job's end

signal.signal(signal.SIGTERM, checkpoint)
time.sleep(600)
"""


@pytest.fixture
def local(api: TestClient) -> Cluster:
    """Two nodes of 4 fake H20s that the local executor runs on (GPUs are indices here: no device nodes)."""
    c = make_cluster(api, preset="2x4:H20")
    with c.db.write() as s, s.begin():
        s.execute(update(Node).values(kind="local"))
    return c


def until(c: Cluster, wid: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        now = utcnow()
        c.sched.run(c.db, now)
        c.sup.run(c.db, now)
        w = c.get(wid)
        if done(w):
            return w
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {w['state']} {w['reason']} {[e['reason'] for e in w['events']][-4:]}")
        time.sleep(0.05)


def restarted(n: int) -> Callable[[dict[str, Any]], bool]:
    """Running its attempt `n`, launched by the supervisor after the resize's restart (the attempt is counted up when
    the resize is decided, while the old one still stops)."""

    def done(w: dict[str, Any]) -> bool:
        restarts = [e for e in w["events"] if e["state"] == "scheduled" and e["reason"].startswith("restarting on")]
        return w["attempt"] == n and len(restarts) == n - 1 and w["events"][-1]["state"] == "running"

    return done


def seen(c: Cluster, wid: str, attempt: int, ranks: int, timeout: float = 30.0) -> list[list[str]]:
    """The `env` line each rank of an attempt printed: [WORLD_SIZE, NODE_RANK, CUDA_VISIBLE_DEVICES, reason,
    SUANLI_ATTEMPT]."""
    logs = workdirs.log_dir(c.sup.home, wid, attempt)
    deadline = time.monotonic() + timeout
    while True:
        lines = []
        for r in range(ranks):
            path = logs / f"rank-{r}.log"
            text = path.read_text() if path.exists() else ""
            found = re.findall(r"^env (.*)$", text, re.M)
            lines.append(found[0].split() if found else [])
        if all(lines):
            return lines
        assert time.monotonic() < deadline, (attempt, lines)
        time.sleep(0.05)


def test_a_shrink_then_a_grow_restart_real_ranks_with_their_new_world(local: Cluster) -> None:
    c = local
    r = c.api.post(f"{API}/workloads", headers=c.tenant.headers, json={
        "spec": {"name": "train", "command": "python3 train.py", "workdir": ".",
                 "resources": {"gpu": "H20", "gpus": {"min": 2, "max": 8}}},
        "workdir_archive": archive({"train.py": TRAIN})})  # fmt: skip
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    w = until(c, wid, lambda w: w["state"] == "running")
    assert w["allocation"]["gpus"] == 8  # grown at placement into the idle GPUs: both nodes
    assert seen(c, wid, 1, 2) == [["2", "0", "0,1,2,3", "-", "1"], ["2", "1", "0,1,2,3", "-", "1"]]

    assert c.scale(wid, 3).status_code == 200  # shrink: 3 of the GPUs it holds, on one node
    w = until(c, wid, restarted(2))
    assert w["allocation"]["gpus"] == 3 and len(w["allocation"]["nodes"]) == 1
    [gpus] = w["allocation"]["nodes"].values()
    [env] = seen(c, wid, 2, 1)
    assert env == ["1", "0", ",".join(map(str, gpus)), "resize", "2"]
    old_logs = workdirs.log_dir(c.sup.home, wid, 1)
    assert all("received SIGTERM" in (old_logs / f"rank-{r}.log").read_text() for r in (0, 1))  # the executor's stop

    assert c.scale(wid, 6).status_code == 200  # grow: placed topology-aware, 6 GPUs on two nodes
    w = until(c, wid, restarted(3))
    assert w["allocation"]["gpus"] == 6
    per_node = sorted(len(g) for g in w["allocation"]["nodes"].values())
    assert per_node == [2, 4]
    envs = seen(c, wid, 3, 2)
    assert [e[0] for e in envs] == ["2", "2"] and [e[3:] for e in envs] == [["resize", "3"], ["resize", "3"]]
    assert sorted(len(e[2].split(",")) for e in envs) == [2, 4]

    reasons = [e["reason"] for e in w["events"]]
    assert [x for x in reasons if x.startswith("resized from")] == [
        "resized from 8 to 3 GPUs: as its owner asked", "resized from 3 to 6 GPUs: as its owner asked"]  # fmt: skip
    assert sum(x.startswith("stopping its ranks to restart them on") for x in reasons) == 2
    assert not any(x.startswith(("failed", "retry")) for x in reasons)

    assert c.api.post(f"{API}/workloads/{wid}/stop", headers=c.tenant.headers).status_code == 200
    done = until(c, wid, lambda w: w["state"] == "stopped")
    assert done["attempt"] == 3
    with c.db.read() as s:
        row = s.get(Workload, wid)
        assert row is not None and row.retries == 0 and row.submitted_at == row.queued_at  # its place kept
    metering.meter(c.db, "test", utcnow(), window_s=60)
    with c.db.read() as s:
        allocs = list(s.scalars(select(Allocation).where(Allocation.workload == wid).order_by(Allocation.started_at)))
    assert [a.gpus for a in allocs] == [8, 3, 6]
    for a, b in itertools.pairwise(allocs):
        assert a.stopped_at == b.started_at  # no gap, no overlap
        assert a.stopped_at is not None and (a.stopped_at - a.started_at).total_seconds() == a.metered_until_s
    assert all(a.settled and a.rate_per_hour == Decimal("8.50") * a.gpus for a in allocs)
    exact = sum((a.rate_per_hour * a.metered_until_s / 3600 for a in allocs), Decimal(0))
    charged = sum((a.charged for a in allocs), Decimal(0))
    assert all(a.charged == cost_of(a.rate_per_hour, a.metered_until_s) for a in allocs)
    assert abs(charged - exact) <= Decimal("1e-8") * len(allocs) / 2
    assert Decimal(done["cost"]) == charged


def test_a_retry_tells_its_ranks_why_it_restarted(local: Cluster) -> None:
    """Not only a resize: a retry's ranks see SUANLI_RESTART_REASON too (failure here); a first start sees none."""
    c = local
    wid = c.submit({"name": "flaky", "command": 'echo "reason=${SUANLI_RESTART_REASON:-none}"; exit 3',
                    "resources": {"gpus": 0}, "retry": {"on": ["failure"], "limit": 1}})  # fmt: skip
    done = until(c, wid, lambda w: w["state"] == "failed" and w["attempt"] == 2)
    assert done["exit_code"] == 3
    logs = [(workdirs.log_dir(c.sup.home, wid, n) / "rank-0.log").read_text() for n in (1, 2)]
    assert logs == ["reason=none\n", "reason=failure\n"]
