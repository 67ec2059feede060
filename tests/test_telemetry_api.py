"""Telemetry through the API in-process, on both databases, with the loops driven by the test: simulated GPUs of a
virtual cluster follow their workloads; an injected over-temperature and an injected XID each drain a node,
requeue or fail the workload by its retry policy, and credit the tenant exactly what the lost attempt cost."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.telemetry.telemetry_loop import TelemetryTicker
from suanli.control.workloads.supervisor import Supervisor
from suanli.db.models import LedgerTransaction
from tests import promtool
from tests.control_plane import Tenant, admin_token, bearer, settings, signup

API = "/api/v1"
STEP = timedelta(seconds=5)


@dataclass
class Fleet:
    api: TestClient
    admin: dict[str, str]
    tenant: Tenant
    sched: SchedulingPass
    sup: Supervisor
    ticker: TelemetryTicker
    clock: datetime

    @property
    def db(self) -> Any:
        return self.api.app.state.server.db  # type: ignore[attr-defined]

    def tick(self, n: int = 1) -> list[str]:
        """`n` sampling periods of simulated time (the simulated GPUs heat by the clock they are given)."""
        findings: list[str] = []
        for _ in range(n):
            self.clock += STEP
            self.sched.run(self.db, self.clock)
            self.sup.run(self.db, self.clock)
            findings += self.ticker.tick(self.clock).findings
        return findings

    def get(self, path: str, who: dict[str, str] | None = None, **params: Any) -> Any:
        r = self.api.get(f"{API}{path}", headers=who or self.admin, params=params)
        assert r.status_code == 200, r.text
        return r.json()

    def workload(self, ref: str) -> dict[str, Any]:
        return self.get(f"/workloads/{ref}", self.tenant.headers)


@pytest.fixture
def api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    """The API in-process; readings count as fresh for an hour, which covers the simulated past of the test."""
    from suanli.api.app import create_app

    with TestClient(create_app(settings(tmp_path / "home", db_url, telemetry_stale_s=3600))) as client:
        yield client


@pytest.fixture
def fleet(api: TestClient, tmp_path: Path) -> Fleet:
    admin = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "dgx-h100-superpod-su"}, headers=admin)
    assert r.status_code == 201, r.text
    tenant = signup(api, "tenant@example.com")
    srv = api.app.state.server  # type: ignore[attr-defined]
    r = api.post(f"{API}/admin/orgs/{tenant.org_id}/transactions", headers=admin,
                 json={"kind": "topup", "amount": "100000", "memo": "test"})  # fmt: skip
    assert r.status_code == 201, r.text
    ticker = TelemetryTicker(srv.db, srv.settings, owner="test-telemetry")
    # Simulated time runs from ten minutes ago, so every sample is in the past when the API reads "now".
    return Fleet(api, admin, tenant, SchedulingPass(), Supervisor(srv.settings.home, grace_s=0.0), ticker,
                 utcnow() - timedelta(minutes=10))  # fmt: skip


def _submit(f: Fleet, name: str, retry: int) -> dict[str, Any]:
    spec = {"name": name, "command": "train", "resources": {"gpu": "H100-SXM", "gpus": 8}, "duration": "2h",
            "retry": {"on": ["node-failure"], "limit": retry}}  # fmt: skip
    r = f.api.post(f"{API}/workloads", json={"spec": spec}, headers=f.tenant.headers)
    assert r.status_code == 201, r.text
    return r.json()


def _running(f: Fleet, ref: str) -> dict[str, Any]:
    for _ in range(20):
        f.tick()
        w = f.workload(ref)
        if w["state"] == "running":
            return w
    raise AssertionError(f"not running: {w['state']} {w['reason']}")


def _credits(f: Fleet) -> list[LedgerTransaction]:
    with f.db.read() as s:
        return list(s.scalars(select(LedgerTransaction).where(LedgerTransaction.key.like("fault-credit:%"))))


def _charged(f: Fleet, allocation_id: str) -> Decimal:
    """Settle the allocation's metering and sum what it was charged."""
    metering.meter(f.db, "test-meter", utcnow())
    with f.db.read() as s:
        txs = s.scalars(select(LedgerTransaction).where(LedgerTransaction.allocation_id == allocation_id,
                                                        LedgerTransaction.kind == "usage"))  # fmt: skip
        return sum((e.amount for tx in txs for e in tx.entries if e.amount > 0), Decimal(0))


def test_gpus_follow_their_workload_and_show_to_their_tenant_only(fleet: Fleet) -> None:
    w = _submit(fleet, "busy", retry=0)
    w = _running(fleet, w["id"])
    fleet.tick(6)
    node = next(iter(w["allocation"]["nodes"]))
    rows = fleet.get("/admin/gpus")
    assert len(rows) == 256
    mine = [r for r in rows if r["workload"] == w["id"]]
    assert sorted((r["node"], r["gpu"]) for r in mine) == [(node, g) for g in range(8)]
    assert all(r["util"] > 50 for r in mine)
    idle = [r for r in rows if not r["workload"]]
    assert all(r["util"] == 0 for r in idle)
    assert min(r["temp_c"] for r in mine) > max(r["temp_c"] for r in idle)

    m = fleet.get(f"/workloads/{w['id']}/metrics", fleet.tenant.headers, resolution="raw")
    assert {(g["node"], g["gpu"]) for g in m["gpus"]} == {(node, g) for g in range(8)}
    assert all(len(g["points"]) >= 5 for g in m["gpus"])
    other = signup(fleet.api, "other@example.com")
    r = fleet.api.get(f"{API}/workloads/{w['id']}/metrics", headers=other.headers)
    assert r.status_code == 404
    for path in ("/admin/gpus", f"/nodes/{node}/metrics", "/cluster/summary"):
        assert fleet.api.get(f"{API}{path}", headers=fleet.tenant.headers).status_code == 403
    assert fleet.api.get("/metrics", headers=fleet.tenant.headers).status_code == 403
    assert fleet.api.get("/metrics").status_code == 401

    summary = fleet.get("/cluster/summary")
    (h100,) = summary["gpus"]["by_model"]
    assert (h100["allocated"], h100["free"], h100["unhealthy"]) == (8, 248, 0)
    assert summary["utilisation"]["allocated_avg"] > 50
    node_m = fleet.get(f"/nodes/{node}/metrics")
    assert len(node_m["gpus"]) == 8 and all(g["points"] for g in node_m["gpus"])

    r = fleet.api.get("/metrics", headers=fleet.admin)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    promtool.assert_valid(r.content)
    series = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for fam in text_string_to_metric_families(r.text) for s in fam.samples}  # fmt: skip
    util = {dict(k)["gpu"]: v for (name, k), v in series.items()
            if name == "DCGM_FI_DEV_GPU_UTIL" and dict(k)["Hostname"] == node}  # fmt: skip
    assert len(util) == 8 and min(util.values()) > 50
    held = {dict(k)["workload"] for (name, k), _ in series.items() if name == "DCGM_FI_DEV_GPU_TEMP"}
    assert held == {w["id"], ""}
    assert series[("suanli_gpus", (("model", "H100-SXM"), ("state", "allocated")))] == 8


def test_overtemp_then_xid_drain_requeue_fail_and_credit(fleet: Fleet) -> None:
    w = _submit(fleet, "victim", retry=1)
    w = _running(fleet, w["id"])
    first_node, first_alloc = next(iter(w["allocation"]["nodes"])), w["allocation"]["id"]
    fleet.tick(2)
    r = fleet.api.post(f"{API}/admin/nodes/{first_node}/faults", json={"gpu": 3, "kind": "overtemp"},
                       headers=fleet.admin)  # fmt: skip
    assert r.status_code == 201, r.text

    findings: list[str] = []
    for _ in range(60):
        findings += fleet.tick()
        if fleet.workload(w["id"])["attempt"] == 2:
            break
    assert any("overtemp" in x or "slowdown" in x for x in findings), findings
    node = fleet.get(f"/admin/nodes/{first_node}")
    assert node["state"] == "draining" and "slowdown" in node["state_reason"]
    assert [g["healthy"] for g in node["gpus"]] == [g != 3 for g in range(8)]
    events = [e["kind"] for e in fleet.get(f"/admin/nodes/{first_node}/events")]
    assert events[:1] == ["injected"] and "overtemp" in events and "drained" in events

    again = fleet.workload(w["id"])
    reasons = [e["reason"] for e in again["events"]]
    assert any(r.startswith("retry 1/1 after node-failure") and "slowdown" in r for r in reasons), reasons
    assert any(r.startswith("credited ") for r in reasons), reasons
    (credit,) = _credits(fleet)
    assert credit.key == f"fault-credit:{first_alloc}" and credit.kind == "refund"
    assert "lost to a hardware fault" in credit.memo
    assert sum(e.amount for e in credit.entries if e.amount > 0) == _charged(fleet, first_alloc) > 0

    again = _running(fleet, w["id"])
    second_node = next(iter(again["allocation"]["nodes"]))
    assert second_node != first_node  # the drained node takes no new work
    r = fleet.api.post(f"{API}/admin/nodes/{second_node}/faults", json={"gpu": 0, "kind": "xid", "xid": 79},
                       headers=fleet.admin)  # fmt: skip
    assert r.status_code == 201, r.text
    for _ in range(10):
        fleet.tick()
        done = fleet.workload(w["id"])
        if done["state"] == "failed":
            break
    assert done["state"] == "failed" and "XID 79" in done["reason"], done["reason"]
    assert fleet.get(f"/admin/nodes/{second_node}")["state"] == "draining"
    assert len(_credits(fleet)) == 2

    summary = fleet.get("/cluster/summary")
    assert {(u["node"], u["gpu"]) for u in summary["unhealthy"]} == {(first_node, 3), (second_node, 0)}
    # The operator repairs the first node: its GPUs are healthy again and the fan fault is gone.
    r = fleet.api.patch(f"{API}/admin/nodes/{first_node}", json={"state": "ready"}, headers=fleet.admin)
    assert r.status_code == 200, r.text
    assert all(g["healthy"] for g in fleet.get(f"/admin/nodes/{first_node}")["gpus"])
    assert fleet.get(f"/admin/nodes/{first_node}/events")[-1]["kind"] == "ready"


def test_fault_injection_is_validated(fleet: Fleet) -> None:
    node = fleet.get("/admin/nodes", limit=1)[0]["name"]
    for body, field in (({"gpu": 8, "kind": "xid", "xid": 79}, "gpu"), ({"gpu": 0, "kind": "fire"}, "kind"),
                        ({"gpu": 0, "kind": "xid"}, "xid")):  # fmt: skip
        r = fleet.api.post(f"{API}/admin/nodes/{node}/faults", json=body, headers=fleet.admin)
        assert r.status_code == 422 and field in r.text, r.text
    r = fleet.api.post(f"{API}/admin/nodes/nope/faults", json={"gpu": 0, "kind": "overtemp"}, headers=fleet.admin)
    assert r.status_code == 404


def test_posted_samples_are_stored_and_judged(fleet: Fleet) -> None:
    node = fleet.get("/admin/nodes", limit=1)[0]["name"]
    t = (utcnow() - timedelta(seconds=5)).timestamp()
    batch = [{"node": node, "gpu": g, "t": t, "util": 42.0, "temp_c": 55.0, "xid": 79 if g == 5 else 0}
             for g in range(8)] + [{"node": "ghost", "gpu": 0, "t": t}]  # fmt: skip
    r = fleet.api.post(f"{API}/telemetry/samples", json={"samples": batch}, headers=fleet.admin)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["stored"] == 8 and out["unknown"] == ["ghost/0"]
    assert len(out["findings"]) == 1 and "79" in out["findings"][0]
    assert fleet.get(f"/admin/nodes/{node}")["state"] == "draining"
    r = fleet.api.post(f"{API}/telemetry/samples", json={"samples": [{"node": node, "gpu": 0, "t": t, "util": 140}]},
                       headers=fleet.admin)  # fmt: skip
    assert r.status_code == 422 and "util" in r.text
    r = fleet.api.post(f"{API}/telemetry/samples", json={"samples": batch}, headers=fleet.tenant.headers)
    assert r.status_code == 403


def test_a_silent_node_loses_its_heartbeat_and_is_drained(fleet: Fleet) -> None:
    w = _submit(fleet, "on-silent", retry=0)
    w = _running(fleet, w["id"])
    node = next(iter(w["allocation"]["nodes"]))
    r = fleet.api.post(f"{API}/admin/nodes/{node}/faults", json={"gpu": 0, "kind": "silent"}, headers=fleet.admin)
    assert r.status_code == 201, r.text
    findings: list[str] = []
    for _ in range(40):  # 200 s of simulated time: the 60 s timeout passes
        findings += fleet.tick()
        if fleet.workload(w["id"])["state"] == "failed":
            break
    assert [x for x in findings if "last reported" in x], findings
    assert all(x.startswith(f"{node}/") for x in findings), findings  # every other node kept reporting
    state = fleet.get(f"/admin/nodes/{node}")
    assert state["state"] == "draining" and "last reported" in state["state_reason"]
    done = fleet.workload(w["id"])
    assert done["state"] == "failed" and "node-failure" in done["reason"]
    assert "heartbeat" in [e["kind"] for e in fleet.get(f"/admin/nodes/{node}/events")]


def test_a_node_set_down_stops_its_work_and_a_cluster_with_work_is_not_removed(fleet: Fleet) -> None:
    w = _running(fleet, _submit(fleet, "on-a-node", retry=1)["id"])
    node, alloc = next(iter(w["allocation"]["nodes"])), w["allocation"]["id"]
    cluster = fleet.get("/admin/clusters")[0]["name"]
    r = fleet.api.delete(f"{API}/admin/clusters/{cluster}", headers=fleet.admin)
    assert r.status_code == 409 and w["id"] in r.json()["detail"], r.text

    r = fleet.api.patch(f"{API}/admin/nodes/{node}", json={"state": "down", "reason": "PSU"}, headers=fleet.admin)
    assert r.status_code == 200, r.text
    for _ in range(10):
        fleet.tick()
        if fleet.workload(w["id"])["attempt"] == 2:
            break
    again = fleet.workload(w["id"])
    reasons = [e["reason"] for e in again["events"]]
    assert any(r.startswith("retry 1/1 after node-failure") and "PSU" in r for r in reasons), reasons
    (credit,) = _credits(fleet)
    assert credit.key == f"fault-credit:{alloc}"
    assert "stopped" in fleet.get(f"/admin/nodes/{node}/events")[-1]["reason"]
    again = _running(fleet, w["id"])
    assert node not in again["allocation"]["nodes"]  # a node that is down takes no work

    r = fleet.api.post(f"{API}/workloads/{w['id']}/stop", headers=fleet.tenant.headers)
    assert r.status_code == 200, r.text
    for _ in range(10):
        fleet.tick()
        if fleet.workload(w["id"])["state"] == "stopped":
            break
    r = fleet.api.delete(f"{API}/admin/clusters/{cluster}", headers=fleet.admin)
    assert r.status_code == 204, r.text


def test_gpus_of_a_draining_node_are_not_counted_free(fleet: Fleet) -> None:
    """Issue: /metrics, the cluster summary and `admin top` counted a draining node's GPUs as free (127) while
    offers said 112. Every view agrees now: free is what a new workload could get."""
    w = _running(fleet, _submit(fleet, "busy", retry=0)["id"])
    held = next(iter(w["allocation"]["nodes"]))
    nodes = [n["name"] for n in fleet.get("/admin/nodes") if n["name"] != held]
    r = fleet.api.patch(
        f"{API}/admin/nodes/{nodes[0]}", json={"state": "draining", "reason": "test"}, headers=fleet.admin
    )
    assert r.status_code == 200, r.text
    fleet.tick(2)
    (h100,) = fleet.get("/cluster/summary")["gpus"]["by_model"]
    (offer,) = [o for o in fleet.get("/offers", fleet.tenant.headers) if o["gpu"] == "H100-SXM"]
    assert (h100["allocated"], h100["free"], h100["draining"], h100["unhealthy"]) == (8, 240, 8, 0), h100
    assert h100["free"] == offer["free"]
    r = fleet.api.get("/metrics", headers=fleet.admin)
    promtool.assert_valid(r.content)
    series = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for fam in text_string_to_metric_families(r.text) for s in fam.samples}  # fmt: skip
    gpus = {dict(k)["state"]: v for (name, k), v in series.items() if name == "suanli_gpus"}
    assert gpus == {"allocated": 8, "free": 240, "draining": 8, "unhealthy": 0}, gpus
