"""From a hostile review of money: a plan's prepaid GPUs are not used (at rate 0) past the plan's period, whatever
happens to the work on them (a resize, a restart, a retry). Virtual clusters, passes at explicit times."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.db.models import Allocation, Plan
from tests.test_resize_virtual import API, Cluster, make_cluster


def _buy(c: Cluster, gpus: int, plan: str = "hourly") -> dict[str, Any]:
    r = c.api.post(f"{API}/orgs/{c.tenant.org_id}/plans", headers=c.tenant.headers,
                   json={"plan": plan, "gpu": "H20", "gpus": gpus})  # fmt: skip
    assert r.status_code == 201, r.text
    return dict(r.json())


def _free_after(c: Cluster, plan_id: str) -> list[tuple[str, float]]:
    """(allocation, seconds it was held at rate 0 past the plan's end) of the plan's allocations."""
    with c.db.read() as s:
        plan = s.get_one(Plan, plan_id)
        rows = list(s.scalars(select(Allocation).where(Allocation.billing_mode == f"plan:{plan_id}")))
        out = []
        for a in rows:
            end = a.stopped_at or c.at(10**6)
            out.append((a.id, max(0.0, (end - plan.ends_at).total_seconds())))
        return out


def test_plan_work_stops_when_the_plan_ends(api: TestClient) -> None:
    c = make_cluster(api, preset="1x8:H20", top_up="100000")
    plan = _buy(c, 2)
    wid = c.submit({"name": "on-plan", "command": "x", "duration": 7200, "billing": f"plan:{plan['id']}",
                    "resources": {"gpu": "H20", "gpus": 2}}, t=0)  # fmt: skip
    c.tick(0)
    assert c.get(wid)["state"] == "running"
    for t in (1800, 3600, 3610, 3620, 3700):
        c.tick(t)
    assert c.get(wid)["state"] in ("stopped", "failed", "succeeded"), c.get(wid)["state"]
    over = [(a, s) for a, s in _free_after(c, plan["id"]) if s > 60]
    assert not over, f"held at rate 0 past the plan's end: {over}"


def test_elastic_plan_work_resized_stops_when_the_plan_ends(api: TestClient) -> None:
    """The owner scales elastic plan work mid-plan (a new allocation, a restart on it); the plan then ends."""
    c = make_cluster(api, preset="1x8:H20", top_up="100000")
    plan = _buy(c, 4)
    wid = c.submit({"name": "el-plan", "command": "x", "duration": 7200, "billing": f"plan:{plan['id']}",
                    "resources": {"gpu": "H20", "gpus": {"min": 1, "max": 4}}}, t=0)  # fmt: skip
    c.tick(0)
    assert c.get(wid)["state"] == "running", c.get(wid)
    first = c.get(wid)["allocation"]["gpus"]
    target = 2 if first != 2 else 3
    r = c.scale(wid, target)
    assert r.status_code == 200, r.text
    c.tick(600)
    c.tick(601)
    assert c.get(wid)["allocation"]["gpus"] == target, c.get(wid)["allocation"]
    for t in (1800, 3600, 3610, 3620, 3700):
        c.tick(t)
    assert c.get(wid)["state"] in ("stopped", "failed", "succeeded"), c.get(wid)["state"]
    over = [(a, s) for a, s in _free_after(c, plan["id"]) if s > 60]
    assert not over, f"held at rate 0 past the plan's end: {over}"


def test_plan_instance_restarted_after_the_plan_ended_is_not_free(api: TestClient) -> None:
    """An instance on a plan, stopped during the plan and started again after it ended, must not get GPUs at rate 0."""
    c = make_cluster(api, preset="1x8:H20", top_up="100000")
    plan = _buy(c, 1)
    wid = c.submit({"name": "inst", "kind": "instance", "billing": f"plan:{plan['id']}",
                    "resources": {"gpu": "H20", "gpus": 1}}, t=0)  # fmt: skip
    c.tick(0)
    assert c.get(wid)["state"] == "running"
    assert c.api.post(f"{API}/workloads/{wid}/stop", headers=c.tenant.headers).status_code == 200
    c.tick(10)
    c.tick(20)
    assert c.get(wid)["state"] == "stopped", c.get(wid)["state"]
    with c.db.write() as s, s.begin():  # the plan ended an hour ago
        p = s.get_one(Plan, plan["id"])
        p.ends_at = c.at(15)
    # The API's clock is the real one: `start` after the end.
    assert c.api.post(f"{API}/workloads/{wid}/start", headers=c.tenant.headers).status_code == 200
    for t in (30, 40, 50):
        c.tick(t)
    with c.db.read() as s:
        free = [
            a.id
            for a in s.scalars(select(Allocation).where(Allocation.workload == wid))
            if a.rate_per_hour == 0 and a.started_at >= c.at(15) - timedelta(seconds=1)
        ]
    assert not free, f"GPUs at rate 0 after the plan ended: {free}"
