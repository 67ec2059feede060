"""A spec's `max_price_per_hour` holds for as long as the work runs, not only at submission: elastic work grown at
placement starts at the most GPUs under its ceiling, the policy's grow into idle GPUs stops below it, an owner's
scale above it is refused, and a price the operator raised while the work was queued makes it wait. Virtual
clusters on both databases, passes at explicit times (`tests/test_resize_virtual.py`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fastapi.testclient import TestClient

from tests.test_resize_virtual import API, H20, Cluster, make_cluster, rigid, sizes

CEILING = Decimal("25.5")  # three H20s an hour (8.50 each)


def capped(name: str, lo: int, hi: int, ceiling: Decimal = CEILING, duration: float = 36000) -> dict[str, Any]:
    return {"name": name, "command": "train", "duration": duration, "max_price_per_hour": str(ceiling),
            "resources": {"gpu": "H20", "gpus": {"min": lo, "max": hi}}}  # fmt: skip


def rates(c: Cluster, wid: str) -> list[Decimal]:
    return [a.rate_per_hour for a in c.allocations(wid)]


def reasons(c: Cluster, wid: str) -> list[str]:
    return [e["reason"] for e in c.get(wid)["events"]]


def set_h20(c: Cluster, price: str) -> None:
    r = c.api.put(f"{API}/admin/prices/gpus/H20", json={"on_demand": price}, headers=c.admin)
    assert r.status_code == 200, r.text


def test_elastic_work_grown_at_placement_starts_at_the_most_gpus_under_its_ceiling(api: TestClient) -> None:
    """Admission checks the ceiling at the minimum (1 GPU); placement grows it into all 8 idle GPUs, and starts it
    at the 3 its ceiling pays for, the placement event saying why."""
    c = make_cluster(api, preset="1x8:H20", top_up="100000")
    wid = c.submit(capped("capped", 1, 8), t=0)
    c.tick(0)
    w = c.get(wid)
    assert w["state"] == "running", w
    assert w["allocation"]["gpus"] == 3, w["allocation"]
    assert Decimal(w["allocation"]["rate_per_hour"]) == CEILING
    placed = [r for r in reasons(c, wid) if r.startswith("placed:")]
    assert len(placed) == 1 and "3 of 8 GPUs admitted: max_price_per_hour: 8 x H20 cost 68.00/h, above the ceiling " \
        "25.5" in placed[0], placed  # fmt: skip


def test_the_policy_never_grows_running_elastic_work_past_its_ceiling(api: TestClient) -> None:
    """Started on 2 GPUs beside a rigid job; when that ends, the policy grows it into the idle GPUs only as far as
    its ceiling (3), and after that says once why it does not grow further."""
    c = make_cluster(api, preset="1x8:H20", top_up="100000")
    hold = c.submit(rigid("hold", 6, 100), t=0)
    c.tick(0)
    wid = c.submit(capped("capped", 1, 8), t=1)
    c.tick(1)
    assert c.get(wid)["state"] == "running" and sizes(c, wid) == [2]
    for t in (100, 101, 102, 110, 200):
        c.tick(t)
    assert c.get(hold)["state"] == "succeeded"
    assert all(r <= CEILING for r in rates(c, wid)), (sizes(c, wid), rates(c, wid))
    assert sizes(c, wid) == [2, 3], sizes(c, wid)
    grown = [r for r in reasons(c, wid) if r.startswith("resized from")]
    assert grown == ["resized from 2 to 3 GPUs: grown into idle GPUs (3 of 8 GPUs admitted: max_price_per_hour: "
                     "8 x H20 cost 68.00/h, above the ceiling 25.5)"], grown  # fmt: skip
    refused = [r for r in reasons(c, wid) if r.startswith("not resized")]
    assert len(refused) == 1 and "max_price_per_hour" in refused[0], refused


def test_an_owners_scale_above_the_ceiling_is_refused(api: TestClient) -> None:
    """At the prices in force: a 409 naming max_price_per_hour, and nothing asked. Within it, the scale is done.
    A price raised between the ask and the pass: the pass refuses it, said in the events, and it keeps its size."""
    c = make_cluster(api, preset="1x8:H20", top_up="100000")
    hold = c.submit(rigid("hold", 7, 36000), t=0)
    c.tick(0)
    wid = c.submit(capped("capped", 1, 8), t=1)
    c.tick(1)
    assert sizes(c, wid) == [1]
    r = c.scale(wid, 4)  # 34.00/h
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == "max_price_per_hour: 4 x H20 cost 34.00/h, above the ceiling 25.5", r.json()
    assert c.get(wid)["scale_to"] is None
    c.api.post(f"{API}/workloads/{hold}/stop", headers=c.tenant.headers)
    c.tick(10)
    c.tick(11)
    assert c.get(hold)["state"] == "stopped"
    assert max(rates(c, wid)) <= CEILING, (sizes(c, wid), rates(c, wid))
    now = sizes(c, wid)[-1]
    assert now == 3, sizes(c, wid)  # the policy grew it as far as the ceiling
    r = c.scale(wid, 2)
    assert r.status_code == 200, r.text
    c.tick(20)
    assert sizes(c, wid)[-1] == 2
    r = c.scale(wid, 3)  # within the ceiling at the prices in force...
    assert r.status_code == 200, r.text
    set_h20(c, "9.25")  # ...but not at the prices in force when the pass carries it out: 27.75/h
    c.tick(21 + c.sched.refresh_s)
    assert sizes(c, wid)[-1] == 2 and max(rates(c, wid)) <= CEILING, (sizes(c, wid), rates(c, wid))
    refused = [r for r in reasons(c, wid) if r.startswith("not resized")]  # (the policy's grow past 3 said once)
    assert refused[-1] == "not resized: max_price_per_hour: 3 x H20 cost 27.75/h, above the ceiling 25.5", refused


def test_work_queued_when_the_operator_raises_the_price_waits_under_its_ceiling(api: TestClient) -> None:
    """Admitted at 8.50/h under its ceiling of 8.50; the operator raises H20 to 9.25 before it is placed: it waits,
    saying why, and starts once the price is back under its ceiling."""
    c = make_cluster(api, preset="1x8:H20", top_up="100000")
    spec = {**rigid("rigid", 1, 3600), "max_price_per_hour": "8.5"}
    wid = c.submit(spec, t=0)
    set_h20(c, "9.25")
    c.tick(0)
    w = c.get(wid)
    assert w["state"] == "pending" and not c.allocations(wid), (w["state"], rates(c, wid))
    assert w["pending"]["reason"] == "cannot start yet: max_price_per_hour: 1 x H20 cost 9.25/h, above the ceiling " \
        "8.5", w["pending"]  # fmt: skip
    set_h20(c, "8.50")
    c.tick(1 + c.sched.refresh_s)
    w = c.get(wid)
    assert w["state"] == "running", w
    assert rates(c, wid) == [H20]
