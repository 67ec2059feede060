"""A GPU two tenants share (slices of it): its readings are the whole GPU's, so they belong to neither. Samples
taken while it is shared name no holder, and a tenant's view of its slice shows no reading (raw or bucket) that
another tenant's work went into; once it holds the GPU alone, its readings are its own again. Found by a hostile
review: one holder's tag overwrote the other's, and a co-tenant's minute buckets showed the other org's memory."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.control.ids import utcnow
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.telemetry import telemetry
from suanli.control.telemetry.telemetry_loop import TelemetryTicker
from suanli.control.workloads.supervisor import Supervisor
from suanli.db.telemetry import GpuRollup, GpuSampleRow
from tests.control_plane import Tenant, admin_token, bearer, settings, signup

API = "/api/v1"


@pytest.fixture
def api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    from suanli.api.app import create_app

    with TestClient(create_app(settings(tmp_path / "home", db_url, telemetry_stale_s=3600))) as client:
        yield client


def _points(api: TestClient, t: Tenant, ref: str, resolution: str) -> list[dict[str, Any]]:
    r = api.get(f"{API}/workloads/{ref}/metrics", headers=t.headers, params={"resolution": resolution})
    assert r.status_code == 200, r.text
    return [p for g in r.json()["gpus"] for p in g["points"]]


def test_a_shared_gpus_readings_are_no_tenants_and_a_lone_holders_are_its_own(api: TestClient) -> None:
    admin = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "1x8:H100", "name": "c1"}, headers=admin)
    assert r.status_code == 201, r.text
    a, b = signup(api, "a@example.com"), signup(api, "b@example.com")
    ids: dict[str, str] = {}
    for t in (a, b):
        r = api.post(f"{API}/admin/orgs/{t.org_id}/transactions", headers=admin,
                     json={"kind": "topup", "amount": "100000", "memo": "t"})  # fmt: skip
        assert r.status_code == 201, r.text
        spec = {"name": "sl", "command": "train", "resources": {"gpu": "H100-SXM", "slice": "1g.10gb"},
                "duration": "2h"}  # fmt: skip
        r = api.post(f"{API}/workloads", json={"spec": spec}, headers=t.headers)
        assert r.status_code == 201, r.text
        ids[t.email] = r.json()["id"]
    srv = api.app.state.server  # type: ignore[attr-defined]
    clock = utcnow() - timedelta(minutes=12)
    sched, sup = SchedulingPass(), Supervisor(srv.settings.home, grace_s=0.0)
    ticker = TelemetryTicker(srv.db, srv.settings, owner="t")

    def tick(n: int) -> None:
        nonlocal clock
        for _ in range(n):
            clock += timedelta(seconds=5)
            sched.run(srv.db, clock)
            sup.run(srv.db, clock)
            ticker.tick(clock)

    tick(4 * 12)
    wa = api.get(f"{API}/workloads/{ids['a@example.com']}", headers=a.headers).json()
    wb = api.get(f"{API}/workloads/{ids['b@example.com']}", headers=b.headers).json()
    assert wa["state"] == wb["state"] == "running"
    assert wa["allocation"]["nodes"] == wb["allocation"]["nodes"]  # one GPU, two tenants
    with srv.db.write() as s, s.begin():
        telemetry.compact(s, utcnow(), telemetry.retention_of(srv.settings))
    with srv.db.read() as s:
        tags = {w for (w,) in s.execute(select(GpuSampleRow.workload).distinct())}
        bucket_tags = {w for (w,) in s.execute(select(GpuRollup.workload).distinct())}
        assert s.query(GpuRollup).count() > 0
    assert not tags & set(ids.values())  # samples of the shared GPU name neither holder
    assert not bucket_tags & set(ids.values())
    for t in (a, b):
        for res in ("raw", "1m"):
            assert _points(api, t, ids[t.email], res) == [], (t.email, res)

    # B stops: A holds the GPU alone, and what it reads from then on is its own.
    r = api.post(f"{API}/workloads/{ids['b@example.com']}/stop", headers=b.headers)
    assert r.status_code in (200, 202), r.text
    tick(3 * 12)
    own = _points(api, a, ids["a@example.com"], "raw")
    assert own and {p["workload"] for p in own} == {ids["a@example.com"]}
    assert _points(api, b, ids["b@example.com"], "raw") == []


def test_a_workload_resized_many_times_shows_one_window_a_gpu_it_kept_and_at_most_the_newest_256(
    api: TestClient,
) -> None:
    """Found by a hostile review: every resize made a new allocation and each of its GPUs a window, each window a
    query, with no bound (908 windows and 913 SQL statements after 120 resizes; a 5,000-resize job ~10 s a call)."""
    from suanli.control.telemetry.observe import MAX_WINDOWS
    from suanli.db.models import Allocation, User

    admin = bearer(admin_token(api))
    assert (
        api.post(f"{API}/admin/clusters", json={"preset": "1x8:H100", "name": "c1"}, headers=admin).status_code == 201
    )
    t = signup(api, "resizer@example.com")
    spec = {"name": "el", "command": "train", "resources": {"gpu": "H100-SXM", "gpus": {"min": 1, "max": 8}}}
    r = api.post(f"{API}/workloads", json={"spec": spec}, headers=t.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    srv = api.app.state.server  # type: ignore[attr-defined]
    with srv.db.read() as s:
        user_id = s.scalar(select(User.id).where(User.email == "resizer@example.com"))
    t0 = utcnow() - timedelta(minutes=10)
    n = 600
    with srv.db.write() as s, s.begin():
        for i in range(n):  # back to back: GPU 0 held throughout, GPU 7 every other allocation
            gpus = list(range(8)) if i % 2 else list(range(7))
            s.add(Allocation(id=f"al_{i:04d}", org_id=t.org_id, user_id=user_id, workload=wid, gpu_model="H100-SXM",
                             gpus=len(gpus), rate_per_hour=0, placement={"c1.h100-sxm-0000": gpus},
                             started_at=t0 + timedelta(seconds=i), stopped_at=t0 + timedelta(seconds=i + 1),
                             settled=True))  # fmt: skip
    r = api.get(f"{API}/workloads/{wid}/metrics", headers=t.headers, params={"resolution": "raw"})
    assert r.status_code == 200, r.text
    doc = r.json()
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for g in doc["gpus"]:
        by_gpu.setdefault(g["gpu"], []).append(g)
    assert all(len(by_gpu[g]) == 1 for g in range(7))  # kept through every resize: one window each
    assert len(doc["gpus"]) == MAX_WINDOWS and doc["windows_left_out"] == 7 + n // 2 - MAX_WINDOWS
    newest = max(g["to"] for g in doc["gpus"])
    assert newest.startswith((t0 + timedelta(seconds=n)).isoformat()[:19])  # the newest are the ones shown
