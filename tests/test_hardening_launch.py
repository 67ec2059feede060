"""Issue: one tenant's spec must never block other tenants' launches (a predicted runtime that overflows a date
failed the whole virtual launch chunk on every pass, and the stuck jobs were billed). The attack first, then the
bound at the edge and the supervisor's isolation of one bad workload."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select, update

from suanli.db.models import Allocation, Workload
from tests.test_resize_virtual import API, make_cluster, rigid


def test_an_absurd_token_count_is_refused_at_the_edge_naming_the_field(api: TestClient) -> None:
    c = make_cluster(api)
    spec: dict[str, Any] = {**rigid("huge", 1, 60), "model": {"preset": "llama3.1-8b", "tokens": 1e18}}
    spec.pop("duration")
    r = api.post(f"{API}/workloads", json={"spec": spec}, headers=c.tenant.headers)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("model.tokens"), r.text
    spec["model"]["tokens"] = 1e12  # a real pre-training run's size is fine
    assert api.post(f"{API}/workloads", json={"spec": spec}, headers=c.tenant.headers).status_code == 201


def test_one_workload_that_cannot_launch_does_not_hold_up_the_others(api: TestClient) -> None:
    """A run length no date can hold (here written past the edge's bound, as an older row or a model bug would)
    ends that workload as unable to start, unbilled; the rest of its launch chunk runs in the same pass."""
    c = make_cluster(api)
    ids = [c.submit(rigid(f"j{i}", 1, 600), t=0) for i in range(4)]
    c.sched.run(c.db, c.at(1))
    bad = ids[1]
    with c.db.write() as s, s.begin():
        s.execute(update(Workload).where(Workload.id == bad).values(predicted_s=1e300))
    c.sup.run(c.db, c.at(1))
    c.sup.run(c.db, c.at(2))  # the pass after: nothing left stuck in `scheduled`
    states = {wid: c.get(wid)["state"] for wid in ids}
    assert [states[w] for w in ids if w != bad] == ["running"] * 3, states
    assert states[bad] == "failed", c.get(bad)
    assert "could not start" in c.get(bad)["reason"]
    with c.db.read() as s:
        alloc = s.scalars(select(Allocation).where(Allocation.workload == bad)).one()
        assert alloc.stopped_at is not None and alloc.stopped_at <= c.at(1)  # closed at once: nothing to charge
