"""Issue: an 8-GPU on-demand job never preempted a 32-GPU spot job on a full cluster (at most 2 GPUs evicted per GPU
needed), and its pending reason did not say why. Spot work exists to be preempted: on-demand (and reserved) work
now evicts spot work of any size when nothing else fits, still evicting the fewest GPUs it can, and both reasons say
so. The pure core first; then through the control plane, where the victim never learns who took its GPUs."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from suanli.sched import ClusterState, Request, Scheduler, SchedulerConfig
from tests.control_plane import signup
from tests.test_resize_virtual import API, make_cluster
from tests.test_sched import node_gpus, occupy, pending_reason, placed_ids, two_leaves


def _cycle(state: ClusterState, queue: list[Request], now: float = 1000.0, policy: str = "default") -> Any:
    return Scheduler(SchedulerConfig(policy=policy)).cycle(state, queue, now)


def test_on_demand_work_evicts_a_spot_gang_of_any_size_when_nothing_else_fits() -> None:
    for policy in ("default", "priority", "elastic"):
        s = ClusterState(two_leaves())  # 64 GPUs: two 32-GPU spot gangs fill it
        occupy(s, "spot-a", tuple(range(32)), priority="spot", tenant="B", start=0.0)
        occupy(s, "spot-b", tuple(range(32, 64)), priority="spot", tenant="B", start=10.0)
        res, new = _cycle(s, [Request("od", 8, 500.0, tenant="A")], policy=policy)
        assert placed_ids(res) == {"od"}, (policy, res.pending)  # before: "needs 8 GPUs; 0 free", nothing evicted
        assert [p.allocation_id for p in res.preempted] == ["spot-b"], policy  # one gang: the later started
        [p] = res.preempted
        assert p.by == "od" and p.reason.startswith("preempted for on-demand work od"), p.reason
        assert "spot work gives way to on-demand work" in p.reason, p.reason
        [placed] = res.placed
        assert "preempted 32 GPUs of spot work" in placed.reason, placed.reason
        assert set(new.allocations) == {"spot-a", "od"}


def test_the_fewest_gpus_are_still_evicted() -> None:
    s = ClusterState(two_leaves())
    occupy(s, "big-spot", tuple(range(32)), priority="spot", start=0.0)
    for n in range(4, 8):  # one 8-GPU spot job per node of the other leaf
        occupy(s, f"small-{n}", node_gpus(n), priority="spot", start=float(n))
    res, _ = _cycle(s, [Request("od", 8, 500.0)])
    assert placed_ids(res) == {"od"}
    assert [p.allocation_id for p in res.preempted] == ["small-7"]  # 8 GPUs, not the 32-GPU gang


def test_the_collateral_limit_still_protects_on_demand_gangs_and_the_reason_says_why() -> None:
    """Preempting work of the same class (a higher LAS level) stays bounded: a 1-GPU job does not evict a 32-GPU
    on-demand gang; and a job that cannot preempt says why, not just that no GPU is free."""
    s = ClusterState(two_leaves())
    occupy(s, "od-a", tuple(range(32)), start=0.0, attained=1e6)
    occupy(s, "od-b", tuple(range(32, 64)), start=0.0, attained=1e6)
    res, _ = _cycle(s, [Request("small", 1, 5000.0)], now=10_000.0)
    assert not res.preempted and not res.placed
    reason = pending_reason(res, "small")
    assert reason == "needs 1 GPUs; 0 free; preemption would evict 32 GPUs of on-demand gangs (limit 2x the request)", (
        reason
    )
    s = ClusterState(two_leaves())  # full of on-demand work that has not run long: nothing may be preempted
    occupy(s, "od-a", tuple(range(64)), start=9_900.0)
    res, _ = _cycle(s, [Request("q", 8, 5000.0)], now=10_000.0)
    assert pending_reason(res, "q") == "needs 8 GPUs; 0 free; nothing it may preempt", pending_reason(res, "q")


def _spec(name: str, billing: str, gpus: int) -> dict[str, Any]:
    return {"name": name, "command": "x", "duration": 3600, "billing": billing,
            "resources": {"gpu": "H20", "gpus": gpus}}  # fmt: skip


def test_through_the_control_plane_both_reasons_say_so_and_the_victim_is_not_told_who(api: TestClient) -> None:
    c = make_cluster(api, preset="4x8:H20")  # 32 H20, one spot gang fills it
    other = signup(api, "other@example.com")
    r = api.post(f"{API}/admin/orgs/{other.org_id}/transactions", headers=c.admin,
                 json={"kind": "topup", "amount": "5000"})  # fmt: skip
    assert r.status_code == 201, r.text
    victim = c.submit(_spec("wide-spot", "spot", 32), t=0)
    c.tick(1)
    assert c.get(victim)["state"] == "running"
    urgent = c.submit(_spec("secret-urgent", "on-demand", 8), t=2, who=other)
    for t in (3, 4, 5):
        c.tick(t)
    got = c.get(urgent, who=other)
    assert got["state"] == "running", got["pending"]
    said = " ".join(e["reason"] for e in got["events"])
    assert "preempted 32 GPUs of spot work" in said, said
    seen = c.get(victim)
    said = " ".join([seen["reason"], *(e["reason"] for e in seen["events"])])
    assert "preempted for on-demand work of another tenant" in said, said
    assert "secret-urgent" not in said and urgent not in said and other.org_id not in said, said
