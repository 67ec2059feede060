"""Work that placement will refuse (a plan's GPUs all in use, an org at its GPU quota) never reaches the cycle
(`control.scheduling.quota_walk`).

The attack (a hostile review): such work reached the cycle, which preempted other tenants' running work to make room
for it, or handed it the free GPUs, every pass; placement then refused it, the victims killed for nothing and the
GPUs idle while another org's work waited. Both databases."""

from __future__ import annotations

from typing import Any

import pytest

from tests.control_plane import Tenant, signup
from tests.test_workloads_api import WL, Platform, make_platform


@pytest.fixture
def platform(api: Any) -> Platform:
    return make_platform(api)


def _wait_all_running(p: Platform, who: Tenant, ids: list[str]) -> None:
    for _ in range(100):
        p.tick()
        st = {w["id"]: w["state"] for w in p.api.get(WL, headers=who.headers).json()}
        if all(st.get(i) == "running" for i in ids):
            return
    raise AssertionError(st)


def _plan_in_use(p: Platform, gpus: int) -> dict[str, Any]:
    """A plan of `gpus` H20s for the tenant, all of them held by its running instance; the spec of more such work."""
    r = p.api.post(f"/api/v1/orgs/{p.tenant.org_id}/plans", headers=p.tenant.headers,
                   json={"plan": "hourly", "gpu": "H20", "gpus": gpus})  # fmt: skip
    assert r.status_code == 201, r.text
    spec = {"kind": "instance", "billing": f"plan:{r.json()['id']}", "resources": {"gpu": "H20", "gpus": gpus}}
    first = p.submit({"name": "first", **spec})
    p.until(first["id"], lambda w: w["state"] == "running")
    return spec


def _running(p: Platform, who: Tenant) -> list[dict[str, Any]]:
    return [w for w in p.api.get(WL, headers=who.headers).json() if w["state"] in ("scheduled", "starting", "running")]


def test_plan_work_over_its_plan_preempts_other_tenants_on_demand_work(platform: Platform) -> None:
    p = platform
    spec = _plan_in_use(p, 8)
    victim = signup(p.api, "victim@example.com")
    p.topup(victim.org_id, "5000")
    boxes = [
        p.submit({"name": f"box{i}", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}}, victim)
        for i in range(15)
    ]
    _wait_all_running(p, victim, [b["id"] for b in boxes])
    assert len(_running(p, victim)) == 15
    # the attacker queues plan work its plan cannot take (all 8 of its GPUs in use)
    extra = [p.submit({"name": f"extra{i}", **spec}) for i in range(3)]
    for _ in range(3):
        p.tick()
    states = {w["name"]: w["state"] for w in p.api.get(WL, headers=victim.headers).json()}
    for e in extra:
        got = p.get(e["id"])
        assert got["state"] == "pending" and got["pending"]["reason"].startswith("waits for plan"), got
    preempted = [n for n, s in states.items() if s == "preempted"]
    assert not preempted, f"victim's on-demand instances preempted for plan work that was then refused: {preempted}"


def test_work_of_an_org_at_its_quota_preempts_other_tenants_spot_work(platform: Platform) -> None:
    p = platform
    r = p.api.put(f"/api/v1/admin/orgs/{p.tenant.org_id}/quota", headers=p.admin, json={"gpus": 8})
    assert r.status_code == 200, r.text
    first = p.submit({"name": "first", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}})
    p.until(first["id"], lambda w: w["state"] == "running")
    victim = signup(p.api, "victim@example.com")
    p.topup(victim.org_id, "5000")
    boxes = [
        p.submit(
            {"name": f"spot{i}", "kind": "instance", "billing": "spot", "resources": {"gpu": "H20", "gpus": 8}}, victim
        )
        for i in range(15)
    ]
    _wait_all_running(p, victim, [b["id"] for b in boxes])
    extra = [
        p.submit({"name": f"extra{i}", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}}) for i in range(3)
    ]
    for _ in range(3):
        p.tick()
    for e in extra:
        got = p.get(e["id"])
        assert got["state"] == "pending" and got["pending"]["reason"].startswith("waiting for quota"), got
    states = {w["name"]: w["state"] for w in p.api.get(WL, headers=victim.headers).json()}
    preempted = [n for n, s in states.items() if s == "preempted"]
    assert not preempted, f"victim's spot instances preempted for over-quota work that was then refused: {preempted}"


def test_an_org_at_its_quota_keeps_idle_gpus_from_everyone_else(platform: Platform) -> None:
    """Quota-blocked work is placed by the cycle on the free GPUs every pass and refused after: another org's work
    behind it never sees those GPUs, which stay idle."""
    p = platform
    r = p.api.put(f"/api/v1/admin/orgs/{p.tenant.org_id}/quota", headers=p.admin, json={"gpus": 8})
    assert r.status_code == 200, r.text
    first = p.submit({"name": "first", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}})
    p.until(first["id"], lambda w: w["state"] == "running")
    for i in range(15):  # 120 GPUs' worth of work its quota will never admit
        p.submit({"name": f"blocked{i}", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}})
    victim = signup(p.api, "victim@example.com")
    p.topup(victim.org_id, "5000")
    theirs = p.submit({"name": "theirs", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}}, victim)
    for _ in range(5):
        p.tick()
    got = p.get(theirs["id"], victim)
    open_gpus = sum(w["allocation"]["gpus"] for w in _running(p, p.tenant))
    assert got["state"] != "pending", (
        f"112 GPUs idle (tenant holds {open_gpus}), yet another org's 8-GPU job waits: {got['pending']}"
    )


def test_a_one_gpu_plan_keeps_the_whole_cluster_from_everyone_else(platform: Platform) -> None:
    """Plan work costs nothing at the affordability walk (rate 0) and outranks every other class: queued past its
    plan's size it is placed on every free GPU each pass and refused after, while another org's work waits."""
    p = platform
    spec = _plan_in_use(p, 1)
    for i in range(130):
        p.submit({"name": f"extra{i}", **spec})
    victim = signup(p.api, "victim@example.com")
    p.topup(victim.org_id, "5000")
    theirs = p.submit({"name": "theirs", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}}, victim)
    for _ in range(5):
        p.tick()
    got = p.get(theirs["id"], victim)
    held = sum(w["allocation"]["gpus"] for w in _running(p, p.tenant))
    assert got["state"] != "pending", f"{128 - held} GPUs idle, yet another org's 8-GPU job waits: {got['pending']}"
