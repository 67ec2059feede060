"""Edge cases of the health chain and of what tenants see, each once a real bug: a fault noticed after a run ended,
a placement racing a failing GPU, a draining node going silent, a failed health transaction, a tenant's rollups
mixing in the next holder, old or future-dated batches, unreadable samples in rollups, times without a zone."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from suanli.control.ids import utcnow
from suanli.control.telemetry import health
from suanli.db.models import Node
from suanli.db.telemetry import GpuRollup
from tests import test_telemetry_api as base
from tests.control_plane import signup
from tests.test_telemetry_api import API, STEP, Fleet, _credits, _running

api, fleet = base.api, base.fleet  # the same in-process platform


def _job(f: Fleet, name: str, duration: str, who: Any = None, retry: int = 1) -> str:
    spec = {"name": name, "command": "train", "resources": {"gpu": "H100-SXM", "gpus": 8}, "duration": duration,
            "retry": {"on": ["node-failure"], "limit": retry}}  # fmt: skip
    r = f.api.post(f"{API}/workloads", json={"spec": spec}, headers=(who or f.tenant).headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _fault(f: Fleet, node: str, **body: Any) -> None:
    r = f.api.post(f"{API}/admin/nodes/{node}/faults", json=body, headers=f.admin)
    assert r.status_code == 201, r.text


def test_a_run_that_ended_before_the_fault_succeeded_and_is_not_credited(fleet: Fleet) -> None:
    wid = _job(fleet, "short", "60s")
    node = next(iter(_running(fleet, wid)["allocation"]["nodes"]))
    for _ in range(14):  # past its end, with only the telemetry loop running (the supervisor has not looked)
        fleet.clock += STEP
        fleet.ticker.tick(fleet.clock)
    _fault(fleet, node, gpu=0, kind="xid", xid=79)
    fleet.clock += STEP
    assert fleet.ticker.tick(fleet.clock).findings
    fleet.sup.run(fleet.db, fleet.clock)
    done = fleet.workload(wid)
    assert (done["state"], done["attempt"]) == ("succeeded", 1)
    assert not _credits(fleet)


def test_work_placed_on_a_gpu_failing_meanwhile_is_stopped(fleet: Fleet) -> None:
    persist, hit = fleet.sched._persist, {}

    def racing(db: Any, now: datetime, placements: list, *a: Any, **k: Any) -> Any:
        if placements and not hit:  # the GPU fails between the pass's snapshot and its commit
            _, _, where, _ = placements[0]
            hit["node"] = node = next(iter(where))
            _fault(fleet, node, gpu=where[node][0], kind="off_bus")
            fleet.ticker.tick(now)
        return persist(db, now, placements, *a, **k)

    fleet.sched._persist = racing  # type: ignore[method-assign]
    wid = _job(fleet, "unlucky", "2h", retry=0)
    for _ in range(10):
        fleet.tick()
    done = fleet.workload(wid)
    assert done["state"] == "failed" and "fallen off the bus" in done["reason"], done["reason"]


def test_a_draining_node_that_goes_silent_fails_its_work(fleet: Fleet) -> None:
    first, second = _job(fleet, "first", "2h", retry=0), None
    node = next(iter(_running(fleet, first)["allocation"]["nodes"]))
    r = fleet.api.patch(f"{API}/admin/nodes/{node}", json={"state": "draining", "reason": "maintenance"},
                        headers=fleet.admin)  # fmt: skip
    assert r.status_code == 200
    _fault(fleet, node, gpu=0, kind="silent")
    for _ in range(40):
        fleet.tick()
        if fleet.workload(first)["state"] == "failed":
            break
    done = fleet.workload(first)
    assert done["state"] == "failed" and "last reported" in done["reason"], done["reason"]
    assert second is None


def test_a_failed_health_transaction_acts_on_the_next_tick(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    wid = _job(fleet, "victim", "2h", retry=0)
    node = next(iter(_running(fleet, wid)["allocation"]["nodes"]))
    _fault(fleet, node, gpu=2, kind="ecc_dbe")
    real, calls = health.apply, []

    def flaky(*a: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("deadlock detected")
        return real(*a)

    monkeypatch.setattr(health, "apply", flaky)
    with pytest.raises(RuntimeError):
        fleet.tick()
    fleet.tick(2)
    gpus = fleet.get(f"/admin/nodes/{node}")["gpus"]
    assert not gpus[2]["healthy"] and "double-bit" in gpus[2]["health_reason"]
    assert fleet.workload(wid)["state"] == "failed"


def test_a_tenant_sees_no_minute_of_the_next_holder(fleet: Fleet) -> None:
    fleet.clock = fleet.clock.replace(second=0, microsecond=0) + timedelta(minutes=1)
    other = signup(fleet.api, "other@example.com")
    fleet.api.post(f"{API}/admin/orgs/{other.org_id}/transactions", headers=fleet.admin,
                   json={"kind": "topup", "amount": "100000", "memo": "t"})  # fmt: skip
    a = _job(fleet, "a", "70s", retry=0)
    _running(fleet, a)
    while fleet.workload(a)["state"] != "succeeded":
        fleet.tick()
    b = _job(fleet, "b", "2h", who=other, retry=0)
    fleet.tick(30)  # B runs on the GPUs A left mid-minute; minutes roll up
    assert fleet.get(f"/workloads/{b}", other.headers)["state"] == "running"
    with fleet.db.read() as s:
        assert s.scalar(select(GpuRollup.gpu_id).limit(1)) is not None
    m = fleet.get(f"/workloads/{a}/metrics", fleet.tenant.headers, resolution="1m")
    raw = fleet.get(f"/workloads/{a}/metrics", fleet.tenant.headers, resolution="raw")
    for g, rg in zip(m["gpus"], raw["gpus"], strict=True):
        mine = [datetime.fromisoformat(p["t"]).timestamp() for p in rg["points"]]
        assert all(p["workload"] == a for p in rg["points"])
        for p in g["points"]:
            t = datetime.fromisoformat(p["t"]).timestamp()
            assert p["workload"] == a and p["n"] == sum(t <= x < t + 60 for x in mine), p


def test_old_batches_do_not_move_the_heartbeat_back_and_future_ones_are_refused(fleet: Fleet) -> None:
    node = fleet.get("/admin/nodes", limit=1)[0]["name"]
    now = utcnow()

    def post(t: float) -> Any:
        return fleet.api.post(f"{API}/telemetry/samples", headers=fleet.admin,
                              json={"samples": [{"node": node, "gpu": 0, "t": t, "util": 1.0}]})  # fmt: skip

    assert post(now.timestamp()).status_code == 200
    assert post((now - timedelta(minutes=5)).timestamp()).status_code == 200  # a retried, older batch
    with fleet.db.read() as s:
        seen = s.scalar(select(Node.last_seen_at).where(Node.name == node))
    assert abs((seen - now).total_seconds()) < 0.01
    r = post((now + timedelta(days=1)).timestamp())
    assert r.status_code == 422 and "samples.0.t" in r.text


def test_unreadable_samples_are_counted_not_averaged(fleet: Fleet) -> None:
    node = fleet.get("/admin/nodes", limit=1)[0]["name"]
    t0 = (utcnow() - timedelta(minutes=10)).replace(second=0, microsecond=0)
    batch = [{"node": node, "gpu": 0, "t": (t0 + timedelta(seconds=5 * k)).timestamp(), "temp_c": 75.0, "util": 50.0,
              **({"error": "GPU is lost"} if k % 2 else {})} for k in range(12)]  # fmt: skip
    assert fleet.api.post(f"{API}/telemetry/samples", json={"samples": batch}, headers=fleet.admin).status_code == 200
    fleet.ticker.tick(utcnow())  # compacts
    m = fleet.get(f"/nodes/{node}/metrics", since=t0.isoformat(), until=(t0 + timedelta(minutes=1)).isoformat(),
                  resolution="1m")  # fmt: skip
    (p,) = [p for p in m["gpus"][0]["points"] if datetime.fromisoformat(p["t"]) == t0]
    assert (p["n"], p["errors"], p["temp_min"], p["temp_c"], p["temp_max"]) == (12, 6, 75.0, 75.0, 75.0)


@pytest.mark.parametrize("params", [{"since": "2026-01-01T00:00:00"}, {"until": "2026-01-01T00:00:00"},
                                    {"until": "0001-01-01T00:00:00Z"}, {"since": "2999-01-01T00:00:00Z"}])  # fmt: skip
def test_odd_times_are_answered_not_crashed_on(fleet: Fleet, params: dict[str, str]) -> None:
    node = fleet.get("/admin/nodes", limit=1)[0]["name"]
    r = fleet.api.get(f"{API}/nodes/{node}/metrics", params=params, headers=fleet.admin)
    assert r.status_code in (200, 422), r.text
    if r.status_code == 422:
        assert "since" in r.text or "until" in r.text
