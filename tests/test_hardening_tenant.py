"""What a foreign tenant, a ¥10 sign-up or a malformed value gets from what the hardening added: the log rank
check, usage by workload name, strict JSON bodies. In-process on both databases."""

from __future__ import annotations

from fastapi.testclient import TestClient

from suanli.control.ids import utcnow
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.workloads.supervisor import Supervisor
from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"


def _placed_two_node_job(api: TestClient) -> tuple[object, str]:
    adm = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=adm).status_code == 201
    victim = signup(api, "victim@example.com")
    api.post(f"{API}/admin/orgs/{victim.org_id}/transactions", json={"kind": "topup", "amount": "1000"}, headers=adm)
    spec = {"name": "secret-run", "command": "x", "duration": 600, "resources": {"gpu": "H20", "gpus": 16}}
    r = api.post(f"{API}/workloads", json={"spec": spec}, headers=victim.headers)
    assert r.status_code == 201, r.text
    return victim, r.json()["id"]


def test_a_foreign_tenant_learns_nothing_from_the_log_rank_check(api: TestClient) -> None:
    victim, wid = _placed_two_node_job(api)
    db = api.app.state.server.db  # type: ignore[attr-defined]
    SchedulingPass().run(db, utcnow())
    Supervisor(api.app.state.server.settings.home).run(db, utcnow())  # type: ignore[attr-defined]
    mallory = signup(api, "mallory@example.com")  # a ¥10 sign-up
    for rank in (0, 1, 99):
        r = api.get(f"{API}/workloads/{wid}/logs", params={"rank": rank}, headers=mallory.headers)
        assert r.status_code == 404 and "secret-run" not in r.text and "node-rank" not in r.text, r.text
    r = api.get(f"{API}/workloads/{wid}/logs", params={"rank": 99}, headers=victim.headers)  # type: ignore[attr-defined]
    assert r.status_code == 422 and "2 node-ranks" in r.json()["detail"], r.text
    for bad in ("-1", "x", str(1 << 40)):
        r = api.get(f"{API}/workloads/{wid}/logs", params={"rank": bad}, headers=victim.headers)  # type: ignore[attr-defined]
        assert r.status_code == 422 and "rank" in r.json()["detail"], r.text


def test_before_placement_any_rank_reads_empty(api: TestClient) -> None:
    victim, wid = _placed_two_node_job(api)  # not placed yet: nobody ran a scheduling pass
    r = api.get(f"{API}/workloads/{wid}/logs", params={"rank": 1}, headers=victim.headers)  # type: ignore[attr-defined]
    assert r.status_code == 200 and r.json()["data"] == "", r.text


def test_usage_by_name_of_another_orgs_workload_or_org_is_refused(api: TestClient) -> None:
    victim, wid = _placed_two_node_job(api)
    mallory = signup(api, "mallory@example.com")
    for ref in ("secret-run", wid):
        r = api.get(f"{API}/orgs/{victim.org_id}/usage", params={"workload": ref}, headers=mallory.headers)  # type: ignore[attr-defined]
        assert r.status_code == 404, r.text
        r = api.get(f"{API}/orgs/{mallory.org_id}/usage", params={"workload": ref}, headers=mallory.headers)
        assert r.status_code == 200 and r.json() == [], r.text
    r = api.get(f"{API}/orgs/{mallory.org_id}/usage", params={"workload": "x" * 129}, headers=mallory.headers)
    assert r.status_code == 422 and "workload" in r.json()["detail"], r.text


def test_malformed_bodies_are_4xx_never_500(api: TestClient) -> None:
    who = signup(api, "tenant@example.com")
    headers = {**who.headers, "content-type": "application/json"}
    many = "{" + ",".join(f'"k{i}": {i}' for i in range(20000)) + ',"k7": 0}'  # a duplicate far down a big object
    for raw in (b'{"name": "\xff\xfe"}', b"\xef\xbb\xbf", b'{"name": "a", "name": "a"}', many.encode(),
                b'{"spec": {"resources": {"gpus": 1, "gpus": 2}}}'):  # fmt: skip
        r = api.post(f"{API}/orgs", content=raw, headers=headers)
        assert 400 <= r.status_code < 500, (raw[:40], r.status_code, r.text[:200])
