"""Running elastic work resized on virtual nodes, on both databases, with the passes driven by the test at explicit
times (no sleeping): the policy's own grow into idle GPUs and shrink for waiting work, a run that goes on with the
work it had left, billing split exactly at the resize, the pass that runs only when something could change."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from suanli.billing.metering import cost_of
from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.workloads.supervisor import Supervisor
from suanli.db.models import Allocation, Workload
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"
H20 = Decimal("8.50")  # the shipped price of an H20-hour


@dataclass
class Cluster:
    """A virtual cluster, a tenant with money, and the passes at times the test chooses (seconds after `t0`)."""

    api: TestClient
    admin: dict[str, str]
    tenant: Tenant
    sched: SchedulingPass
    sup: Supervisor
    t0: datetime

    @property
    def db(self) -> Any:
        return self.api.app.state.server.db  # type: ignore[attr-defined]

    def at(self, t: float) -> datetime:
        return self.t0 + timedelta(seconds=t)

    def tick(self, t: float) -> None:
        """What the server's loop does once, at `t`: the supervisor (runs that ended), the scheduling pass, the
        supervisor again (launches and restarts what the pass decided), as at one instant."""
        now = self.at(t)
        self.sup.run(self.db, now)
        self.sched.run(self.db, now)
        self.sup.run(self.db, now)

    def submit(self, spec: dict[str, Any], t: float | None = None, who: Tenant | None = None) -> str:
        r = self.api.post(f"{API}/workloads", json={"spec": spec}, headers=(who or self.tenant).headers)
        assert r.status_code == 201, r.text
        wid = str(r.json()["id"])
        if t is not None:  # it arrived at `t` on the test's clock
            with self.db.write() as s, s.begin():
                s.execute(update(Workload).where(Workload.id == wid)
                          .values(created_at=self.at(t), submitted_at=self.at(t), queued_at=self.at(t)))  # fmt: skip
        return wid

    def get(self, ref: str, who: Tenant | None = None) -> dict[str, Any]:
        r = self.api.get(f"{API}/workloads/{ref}", headers=(who or self.tenant).headers)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def scale(self, ref: str, gpus: Any, who: Tenant | None = None) -> Any:
        return self.api.post(f"{API}/workloads/{ref}/scale", json={"gpus": gpus}, headers=(who or self.tenant).headers)

    def allocations(self, wid: str) -> list[Allocation]:
        with self.db.read() as s:
            return list(s.scalars(select(Allocation).where(Allocation.workload == wid).order_by(Allocation.started_at)))

    def row(self, wid: str) -> Workload:
        with self.db.read() as s:
            w = s.get(Workload, wid)
            assert w is not None
            s.expunge(w)
            return w


def make_cluster(api: TestClient, preset: str = "2x8:H20", top_up: str = "5000") -> Cluster:
    admin = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": preset}, headers=admin)
    assert r.status_code == 201, r.text
    tenant = signup(api, "tenant@example.com")
    r = api.post(f"{API}/admin/orgs/{tenant.org_id}/transactions", headers=admin,
                 json={"kind": "topup", "amount": top_up, "memo": "test"})  # fmt: skip
    assert r.status_code == 201, r.text
    home = api.app.state.server.settings.home  # type: ignore[attr-defined]
    t0 = utcnow().replace(microsecond=0) + timedelta(seconds=5)
    return Cluster(api, admin, tenant, SchedulingPass(), Supervisor(home, grace_s=1.0), t0)


@pytest.fixture
def cluster(api: TestClient) -> Iterator[Cluster]:
    yield make_cluster(api)


def elastic(name: str, lo: int, hi: int, duration: float, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": "train", "duration": duration,
            "resources": {"gpu": "H20", "gpus": {"min": lo, "max": hi}}, **extra}  # fmt: skip


def rigid(name: str, gpus: int, duration: float) -> dict[str, Any]:
    return {"name": name, "command": "x", "duration": duration, "resources": {"gpu": "H20", "gpus": gpus}}


def sizes(c: Cluster, wid: str) -> list[int]:
    return [a.gpus for a in c.allocations(wid)]


def resize_events(c: Cluster, wid: str) -> list[str]:
    return [e["reason"] for e in c.get(wid)["events"] if e["reason"].startswith("resized from")]


def test_the_policy_grows_running_elastic_work_into_gpus_that_became_idle(cluster: Cluster) -> None:
    """A rigid job holds one node; the elastic job runs beside it. When the rigid job ends (nothing queued), the
    pass grows the elastic job into the idle node: one allocation closes as the next opens, the run restarts on
    the new GPUs with the work it had left (scaled to its new speed, plus the restart penalty), as `suanli sim`
    runs it; no retry is spent and it keeps its place."""
    c = cluster
    hold = c.submit(rigid("hold", 8, 100), t=0)
    grow = c.submit(elastic("grow", 2, 16, 3600), t=0)
    c.tick(0)
    assert c.get(hold)["state"] == "running" and c.get(grow)["state"] == "running"
    before = sizes(c, grow)
    assert before == [8], before  # grown at placement into the other node's 8 GPUs
    start = c.row(grow)
    assert start.ends_at is not None
    c.tick(100)  # the rigid job ends; the queue is empty, but 8 GPUs are idle
    assert c.get(hold)["state"] == "succeeded"
    assert sizes(c, grow) == [8, 16]
    old, new = c.allocations(grow)
    assert old.stopped_at == new.started_at == c.at(100)
    assert resize_events(c, grow) == ["resized from 8 to 16 GPUs: grown into idle GPUs"]
    w = c.get(grow)
    assert w["state"] == "running" and w["attempt"] == 2 and w["allocation"]["gpus"] == 16
    row = c.row(grow)
    assert row.retries == 0 and row.restart_reason == "resize" and row.started_at == start.started_at
    assert row.submitted_at == start.submitted_at  # its place in the queue
    assert row.handle is not None and row.handle["restart"] == "resize" and row.handle["attempt"] == 2
    # the rest of the run: (3600 s of work at 2 GPUs' speed; 100 s of it done at 8 GPUs' speed) on 16 GPUs, plus 30 s
    length8, length16 = start.predicted_s, row.predicted_s
    assert length8 is not None and length16 is not None and length16 < length8 < 3600
    expected = ((length8 - 100) / length8 + 30 / 3600) * length16
    assert row.ends_at is not None
    assert abs((row.ends_at - c.at(100)).total_seconds() - expected) < 1e-3
    states = [e["state"] for e in w["events"]]
    assert states[-3:] == ["scheduled", "starting", "running"]
    log = c.api.get(f"{API}/workloads/{grow}/logs", headers=c.tenant.headers).json()["data"]
    assert "(attempt 2, restarted after resize)" in log


def test_the_policy_shrinks_grown_work_for_waiting_work_and_no_gpu_is_held_twice(cluster: Cluster) -> None:
    """What the server once refused to do (it ran grown work at its placed size): waiting work now gets the GPUs a
    grown elastic job gives back; the shrink and the placement happen in one pass, no GPU in two open allocations."""
    c = cluster
    grow = c.submit(elastic("grow", 4, 16, 3600), t=0)
    c.tick(0)
    assert sizes(c, grow) == [16]
    big = c.submit(rigid("big", 8, 60), t=10)
    c.tick(10)
    assert c.get(big)["state"] == "running"
    assert resize_events(c, grow)[0] == "resized from 16 to 4 GPUs: shrunk to free GPUs for waiting work"
    held: dict[tuple[str, int], str] = {}
    with c.db.read() as s:
        for a in s.scalars(select(Allocation).where(Allocation.stopped_at.is_(None))):
            for node, gpus in a.placement.items():
                for g in gpus:
                    assert (node, g) not in held, f"{node}[{g}] held by {held[(node, g)]} and {a.workload}"
                    held[(node, g)] = a.workload
    assert sorted(held.values()).count(big) == 8
    c.tick(11)  # nothing waits now: the idle GPUs beside `big` go back to the elastic job
    assert sizes(c, grow)[-1] == 8 and c.get(grow)["state"] == "running"


def test_billing_splits_exactly_at_the_resize(cluster: Cluster) -> None:
    """The sum of the two allocations' charges is rate1 x t1 + rate2 x t2, to the unit of 1e-8."""
    c = cluster
    grow = c.submit(elastic("grow", 2, 16, 36000), t=0)
    c.tick(0)
    n1 = sizes(c, grow)[0]
    r = c.scale(grow, 4)
    assert r.status_code == 200 and r.json()["scale_to"] == 4, r.text
    c.tick(125)
    assert sizes(c, grow) == [n1, 4]
    r = c.api.post(f"{API}/workloads/{grow}/stop", headers=c.tenant.headers)
    assert r.status_code == 200
    c.tick(125 + 317)
    assert c.get(grow)["state"] == "stopped"
    metering.meter(c.db, "test", c.at(1000), window_s=60)
    a1, a2 = c.allocations(grow)
    assert (a1.rate_per_hour, a2.rate_per_hour) == (H20 * n1, H20 * 4)
    assert (a1.metered_until_s, a2.metered_until_s) == (125, 317)
    assert a1.settled and a2.settled
    tx = c.api.get(f"{API}/orgs/{c.tenant.org_id}/transactions", headers=c.tenant.headers, params={"limit": 1000})
    ledger = -sum((Decimal(t["amount"]) for t in tx.json() if t["kind"] == "usage"), Decimal(0))
    assert ledger == a1.charged + a2.charged
    assert a1.charged == cost_of(a1.rate_per_hour, 125) and a2.charged == cost_of(a2.rate_per_hour, 317)
    exact = a1.rate_per_hour * 125 / 3600 + a2.rate_per_hour * 317 / 3600
    assert abs(a1.charged + a2.charged - exact) <= Decimal("1e-8")
    assert c.row(grow).retries == 0


def test_a_grow_waits_until_the_gpus_are_free_saying_why_once(cluster: Cluster) -> None:
    """The owner asks for more GPUs than are free: the workload keeps running at its size, its events say why (once,
    however many passes look), and the grow is carried out by the pass after the GPUs free up. The policy leaves a
    size its owner chose alone."""
    c = cluster
    hold = c.submit(rigid("hold", 8, 300), t=0)
    grow = c.submit(elastic("grow", 2, 16, 36000), t=0)
    c.tick(0)
    assert sizes(c, grow) == [8]
    assert c.scale(grow, 12).status_code == 200
    for t in (1, 2, 40, 80):
        c.tick(t)
    reasons = [e["reason"] for e in c.get(grow)["events"]]
    waits = [r for r in reasons if r.startswith("scale to 12 GPUs waits: ")]
    assert len(waits) == 1 and "counting the 8 it holds" in waits[0], reasons
    assert "scale to 12 GPUs asked by tenant@example.com" in reasons
    assert sizes(c, grow) == [8] and c.get(grow)["scale_to"] == 12
    c.tick(300)  # `hold` ends: the 12 are placed (topology-aware: one full node and 4 of the other)
    assert c.get(hold)["state"] == "succeeded"
    assert sizes(c, grow) == [8, 12]
    assert resize_events(c, grow) == ["resized from 8 to 12 GPUs: as its owner asked"]
    nodes = c.get(grow)["allocation"]["nodes"]
    assert sorted(len(g) for g in nodes.values()) == [4, 8]
    c.tick(301)
    c.tick(400)
    assert sizes(c, grow) == [8, 12], "the policy grew work its owner sized"


def test_a_shrink_keeps_a_subset_of_the_gpus_it_holds(cluster: Cluster) -> None:
    c = cluster
    grow = c.submit(elastic("grow", 2, 16, 36000), t=0)
    c.tick(0)
    before = c.get(grow)["allocation"]["nodes"]
    assert sum(len(g) for g in before.values()) == 16
    assert c.scale(grow, 6).status_code == 200
    c.tick(5)
    after = c.get(grow)["allocation"]["nodes"]
    assert sum(len(g) for g in after.values()) == 6 and len(after) == 1
    assert all(set(g) <= set(before[n]) for n, g in after.items())
    assert resize_events(c, grow) == ["resized from 16 to 6 GPUs: as its owner asked"]


def test_a_grow_the_org_cannot_hold_is_refused_once_and_the_pass_does_not_spin(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy would grow the job into idle GPUs but the org's quota says no: its events say so once, and with
    nothing changing the pass does not run a cycle again until `refresh_s` has passed; an empty queue with no elastic
    work that could grow runs no cycle at all."""
    c = cluster
    r = c.api.put(f"{API}/admin/orgs/{c.tenant.org_id}/quota", headers=c.admin, json={"gpus": 12})
    assert r.status_code == 200, r.text
    hold = c.submit(rigid("hold", 8, 100), t=0)
    c.tick(0)
    grow = c.submit(elastic("grow", 2, 16, 36000), t=1)
    c.tick(1)
    assert sizes(c, grow) == [4]  # grown at placement to 8, admitted at the 4 the quota leaves
    cycles: list[float] = []
    assert c.sched.scheduler is not None
    real = c.sched.scheduler.cycle

    def counted(*args: Any, **kw: Any) -> Any:
        cycles.append(args[2])
        return real(*args, **kw)

    monkeypatch.setattr(c.sched.scheduler, "cycle", counted)
    c.tick(100)  # `hold` ends: 12 GPUs idle, the quota admits 8 more
    assert sizes(c, grow) == [4, 12] and c.get(hold)["state"] == "succeeded"  # as far as the quota admits
    assert resize_events(c, grow)[0].startswith("resized from 4 to 12 GPUs: grown into idle GPUs (12 of 16 GPUs "
                                                "admitted: quota: ")  # fmt: skip
    for t in (101, 102, 103, 110):  # 4 GPUs idle; growing to 16 is over the quota
        c.tick(t)
    refused = [e["reason"] for e in c.get(grow)["events"] if e["reason"].startswith("not resized")]
    assert len(refused) == 1 and "quota" in refused[0], refused
    ran = len(cycles)
    assert ran <= 3, cycles  # the grow, the refused grow, and no more while nothing changes
    for t in (111, 112, 113, 114):
        c.tick(t)
    assert len(cycles) == ran
    c.tick(100 + c.sched.refresh_s + 1)  # time alone: one more look
    assert len(cycles) == ran + 1
    assert sizes(c, grow) == [4, 12]
    c.api.post(f"{API}/workloads/{grow}/stop", headers=c.tenant.headers)
    c.tick(200)
    assert c.get(grow)["state"] == "stopped"
    ran = len(cycles)
    for t in (201, 202, 300, 400):  # nothing queued, nothing elastic running: no cycle
        c.tick(t)
    assert len(cycles) == ran
