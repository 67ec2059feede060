"""Issue: work that can never run was accepted — a gang larger than any one cluster (counted over all clusters),
a CPU-only job over 2 nodes (ran on one), a log of a node-rank that does not exist (printed nothing, exit 0) — and
a log offset past what the filesystem can seek to was a 500. Attacks first; in-process on both databases."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from suanli.control.ids import utcnow
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.workloads.supervisor import Supervisor
from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"


def _two_clusters(api: TestClient) -> Any:
    adm = bearer(admin_token(api))
    for name in ("east", "west"):
        r = api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20", "name": name}, headers=adm)
        assert r.status_code == 201, r.text
    who = signup(api, "tenant@example.com")
    r = api.post(f"{API}/admin/orgs/{who.org_id}/transactions", json={"kind": "topup", "amount": "100000"}, headers=adm)
    assert r.status_code == 201, r.text
    return who


def _submit(api: TestClient, who: Any, resources: dict[str, Any]) -> Any:
    spec = {"name": "x", "command": "true", "duration": 60, "resources": resources}
    return api.post(f"{API}/workloads", json={"spec": spec}, headers=who.headers)


def test_a_gang_larger_than_any_one_cluster_is_refused(api: TestClient) -> None:
    who = _two_clusters(api)  # 16 H20 in each, 32 in all
    r = _submit(api, who, {"gpu": "H20", "gpus": 32})
    assert r.status_code == 422 and r.json()["detail"].startswith("resources.gpus"), r.text
    assert "16" in r.json()["detail"] and "one cluster" in r.json()["detail"]
    assert _submit(api, who, {"gpu": "H20", "gpus": 16}).status_code == 201
    r = _submit(api, who, {"gpu": "H20", "gpus": {"min": 8, "max": 32}})  # elastic: its minimum must fit
    assert r.status_code == 201, r.text


def test_cpu_only_work_over_several_nodes_is_refused(api: TestClient) -> None:
    who = _two_clusters(api)
    r = _submit(api, who, {"gpus": 0, "nodes": 2})
    assert r.status_code == 422 and r.json()["detail"].startswith("resources.nodes"), r.text
    assert _submit(api, who, {"gpus": 0, "nodes": 1}).status_code == 201


def test_a_log_of_a_rank_that_does_not_exist_or_past_any_file_is_an_error_or_empty(api: TestClient) -> None:
    who = _two_clusters(api)
    r = _submit(api, who, {"gpu": "H20", "gpus": 16, "nodes": 2})
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    db = api.app.state.server.db  # type: ignore[attr-defined]
    now = utcnow()
    SchedulingPass().run(db, now)
    Supervisor(api.app.state.server.settings.home).run(db, now)  # type: ignore[attr-defined]
    r = api.get(f"{API}/workloads/{wid}/logs", params={"rank": 99}, headers=who.headers)  # placed on 2 nodes
    assert r.status_code == 422 and r.json()["detail"].startswith("rank"), r.text
    assert "2 node-ranks" in r.json()["detail"]
    for rank in (0, 1):
        assert api.get(f"{API}/workloads/{wid}/logs", params={"rank": rank}, headers=who.headers).status_code == 200
    r = api.get(f"{API}/workloads/{wid}/logs", headers=who.headers)
    assert r.status_code == 200 and r.json()["data"], r.text  # running: the virtual executor wrote its first line
    r = api.get(f"{API}/workloads/{wid}/logs", params={"offset": 1 << 50}, headers=who.headers)
    assert r.status_code == 200 and r.json()["data"] == "", r.text


def test_a_quote_for_a_gpu_count_no_plan_fits_says_so(api: TestClient) -> None:
    """`quote --gpus 7` said "nothing priced and free fits" (there were 32 free GPUs) and exited 0."""
    who = _two_clusters(api)
    body = {"model": "llama3.1-8b", "tokens": 1e9, "gpu": "H20"}
    ok = api.post(f"{API}/quotes", json={**body, "gpus": 8}, headers=who.headers)
    assert ok.status_code == 200 and ok.json(), ok.text
    r = api.post(f"{API}/quotes", json={**body, "gpus": 7}, headers=who.headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("gpus: no parallel plan"), r.text
    r = api.post(f"{API}/quotes", json={**body, "gpus": 64}, headers=who.headers)  # more than any cluster: no offer
    assert r.status_code == 200 and r.json() == [], r.text


def test_gpu_work_where_no_node_has_a_gpu_is_refused_in_words(api: TestClient) -> None:
    # Seen on a host whose GPU nodes were not yet registered: `gpus: 1` (any model) was refused with
    # "resources.gpu: no registered node has ; GPUs on offer: none", the model list left empty.
    adm = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20", "name": "east"}, headers=adm).status_code == 201
    who = signup(api, "tenant@example.com")
    assert api.delete(f"{API}/admin/clusters/east", headers=adm).status_code == 204  # no GPU node left
    r = _submit(api, who, {"gpus": 1})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == "resources.gpus: no registered node has a GPU (GPUs on offer: none)", r.text
