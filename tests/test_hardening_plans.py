"""Issue: plans were sold only for capacity that exists, but the scheduler still handed a plan's idle GPUs to other
tenants' on-demand and spot work, so a plan holder could find its plan's GPUs taken (and its work then evicted theirs).
The scheduling pass now holds back, of each GPU model, what active plans reserve and their work leaves idle; a plan is
sold only from GPUs free or held by spot work (which gives way to it), never from on-demand work's, which is not
stopped for a plan. On virtual clusters with the passes at explicit times, on both databases."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from suanli.control.money import plans
from suanli.control.scheduling.plan_holds import PlanHolds
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.db.models import Allocation
from suanli.sched import ClusterState, Request, Scheduler, SchedulerConfig
from tests.clusters import homogeneous_cluster
from tests.control_plane import Tenant, signup
from tests.test_resize_virtual import API, Cluster, make_cluster


def _job(name: str, gpus: int, billing: str = "on-demand") -> dict[str, Any]:
    return {"name": name, "command": "x", "duration": 3600, "billing": billing,
            "resources": {"gpu": "H20", "gpus": gpus}}  # fmt: skip


def _other(c: Cluster) -> Tenant:
    b = signup(c.api, "other@example.com")
    r = c.api.post(f"{API}/admin/orgs/{b.org_id}/transactions", headers=c.admin,
                   json={"kind": "topup", "amount": "100000"})  # fmt: skip
    assert r.status_code == 201, r.text
    return b


def _buy(c: Cluster, gpus: int, status: int = 201) -> dict[str, Any]:
    r = c.api.post(f"{API}/orgs/{c.tenant.org_id}/plans", headers=c.tenant.headers,
                   json={"plan": "daily", "gpu": "H20", "gpus": gpus})  # fmt: skip
    assert r.status_code == status, r.text
    return dict(r.json())


def _events(c: Cluster, wid: str, who: Tenant) -> str:
    w = c.get(wid, who)
    return " ".join([w.get("reason") or "", *(e["reason"] for e in w["events"])])


def _held(c: Cluster, org_id: str) -> int:
    with c.db.read() as s:
        return int(s.scalar(select(func.coalesce(func.sum(Allocation.gpus), 0))
                            .where(Allocation.org_id == org_id, Allocation.stopped_at.is_(None))) or 0)  # fmt: skip


def test_a_plans_gpus_are_there_for_its_work_after_another_tenant_fills_the_cluster(api: TestClient) -> None:
    c = make_cluster(api, preset="4x8:H20", top_up="100000")  # 32 H20
    plan = _buy(c, 16)["id"]
    b = _other(c)
    theirs = [c.submit(_job(f"fill-{i}", 8), t=0, who=b) for i in range(4)]
    c.tick(0)
    states = {w: c.get(w, b)["state"] for w in theirs}
    assert sorted(states.values()) == ["pending", "pending", "running", "running"], states  # before: all 4 ran
    waiting = [w for w in theirs if states[w] == "pending"]
    why = c.get(waiting[0], b)["pending"]["reason"]
    assert "needs 8 H20; 16 free, of which plans hold back 16" in why, why

    mine = c.submit(_job("on-plan", 16, f"plan:{plan}"), t=1)
    c.tick(1)
    c.tick(2)
    got = c.get(mine)
    assert got["state"] == "running", got["pending"]
    assert got["allocation"]["billing_mode"] == f"plan:{plan}"
    for w in theirs:  # nobody's work was stopped for it (before: the plan's work evicted two of these)
        assert "preempted for" not in _events(c, w, b), _events(c, w, b)
    assert _held(c, b.org_id) == 16 and _held(c, c.tenant.org_id) == 16


def test_a_plan_is_not_sold_from_gpus_on_demand_work_holds_and_spot_work_gives_way(api: TestClient) -> None:
    c = make_cluster(api, preset="4x8:H20", top_up="100000")
    b = _other(c)
    busy = [c.submit(_job(f"od-{i}", 8), t=0, who=b) for i in range(3)]
    c.tick(0)
    assert all(c.get(w, b)["state"] == "running" for w in busy)
    before = c.api.get(f"{API}/orgs/{c.tenant.org_id}/balance", headers=c.tenant.headers).json()["exact"]
    detail = _buy(c, 16, status=409)["detail"]  # before: sold, and its work would have had to evict on-demand work
    assert detail.startswith("gpus: 16 x H20 asked; 8 of the 32 H20 GPUs in service are left to reserve until"), detail
    assert "(0 reserved by plans, 24 held by running on-demand work, which a plan does not stop)" in detail, detail
    after = c.api.get(f"{API}/orgs/{c.tenant.org_id}/balance", headers=c.tenant.headers).json()["exact"]
    assert after == before  # nothing paid
    plan = _buy(c, 8)["id"]  # what is left is sold

    spot = c.submit(_job("spot-8", 8, "spot"), t=1, who=b)  # the plan's 8 are held back: spot work waits
    c.tick(1)
    assert c.get(spot, b)["state"] == "pending"
    assert "plans hold back 8" in c.get(spot, b)["pending"]["reason"]

    mine = c.submit(_job("on-plan", 8, f"plan:{plan}"), t=2)
    c.tick(2)
    c.tick(3)
    assert c.get(mine)["state"] == "running"
    assert all("preempted for" not in _events(c, w, b) for w in busy)


def test_spot_work_on_a_new_plans_gpus_gives_way_to_its_work(api: TestClient) -> None:
    c = make_cluster(api, preset="4x8:H20", top_up="100000")
    b = _other(c)
    spot = [c.submit(_job(f"spot-{i}", 8, "spot"), t=0, who=b) for i in range(4)]
    c.tick(0)
    assert all(c.get(w, b)["state"] == "running" for w in spot)
    plan = _buy(c, 16)["id"]  # spot work's GPUs can be had: sold
    od = c.submit(_job("od", 8), t=1, who=b)  # on-demand work may take spot work's GPUs, but not the plan's
    od2 = c.submit(_job("od2", 16), t=1.5, who=b)
    c.tick(1)
    c.tick(2)
    assert c.get(od, b)["state"] == "running" and c.get(od2, b)["state"] == "pending"
    why = c.get(od2, b)["pending"]["reason"]
    assert why.endswith("would not make room: needs 16 H20; 24 free, of which plans hold back 16"), why
    mine = c.submit(_job("on-plan", 16, f"plan:{plan}"), t=3)
    c.tick(3)
    c.tick(4)
    assert c.get(mine)["state"] == "running"
    gave_way = [w for w in spot if "spot work gives way to reserved work" in _events(c, w, b)]
    assert len(gave_way) == 2, [_events(c, w, b) for w in spot]
    assert c.get(od, b)["state"] == "running" and "preempted for" not in _events(c, od, b)


def test_a_purchase_between_a_passs_snapshot_and_its_placements_is_not_oversold(api: TestClient) -> None:
    """The pass decides on a snapshot; a plan bought before it writes its placements leaves them for the next pass,
    which holds the plan's GPUs back (a placement chunk and a purchase never overlap: the chunk locks the plans'
    version row, which each purchase bumps first)."""
    c = make_cluster(api, preset="2x8:H20", top_up="100000")
    b = _other(c)
    fill = c.submit(_job("fill", 16), t=0, who=b)
    bought: list[str] = []
    real = SchedulingPass._persist

    def persist(self: SchedulingPass, db: Any, *args: Any) -> None:
        if not bought:  # a purchase lands after the snapshot, before the placements are written
            bought.append(_buy(c, 16)["id"])
        real(self, db, *args)

    SchedulingPass._persist = persist  # type: ignore[method-assign]
    try:
        c.tick(0)
    finally:
        SchedulingPass._persist = real  # type: ignore[method-assign]
    assert bought and c.get(fill, b)["state"] == "pending"  # before: placed on the GPUs just sold
    c.tick(1)
    assert c.get(fill, b)["state"] == "pending"
    assert "plans hold back 16" in c.get(fill, b)["pending"]["reason"]
    with c.db.read() as s:
        assert plans.version(s) >= 1


def test_over_several_clusters_each_holds_back_what_the_others_cannot() -> None:
    """Two clusters of 16 H20 and a plan of 16 idle: the pass visits them in turn. The first holds nothing back while
    the second has 16 free; once the first is full, the second holds back all 16, so other work waits there, and the
    plan's work, tried on the first and then the second, runs."""
    one, two = (ClusterState(homogeneous_cluster("H20", nodes=2, gpn=8)) for _ in range(2))
    sched = Scheduler(SchedulerConfig())
    theirs = [Request(f"b{i}", 8, float(i), tenant="B") for i in range(4)]
    plan_work = Request("a", 16, 10.0, tenant="A", priority="reserved")
    holds = PlanHolds.over({"H20": {"A": 16}}, [one, two])
    holds.on(one)
    assert one.held == {"H20": {"A": 0}}
    res, one_after = sched.cycle(one, [*theirs, plan_work], 0.0)
    assert {p.request_id for p in res.placed} == {"a"}  # reserved work first: on its org's plan, from the unheld
    holds.after(one_after, res)
    assert holds.idle == {"H20": {"A": 0}}  # its plan's GPUs are in use: nothing left to hold back
    holds.on(two)
    assert two.held == {"H20": {"A": 0}}
    res, _ = sched.cycle(two, theirs, 0.0)
    assert {p.request_id for p in res.placed} == {"b0", "b1"}

    holds = PlanHolds.over({"H20": {"A": 16}}, [one, two])  # the plan's work not queued: its 16 stay to be had
    holds.on(one)
    res, one_after = sched.cycle(one, theirs, 0.0)
    assert {p.request_id for p in res.placed} == {"b0", "b1"}
    holds.after(one_after, res)
    holds.on(two)
    assert two.held == {"H20": {"A": 16}}
    res, two_after = sched.cycle(two, theirs[2:], 0.0)
    assert not res.placed and "plans hold back 16" in res.pending[0].reason
    assert one_after.free_whole_of("H20") + two_after.free_whole_of("H20") == 16
