"""Endpoints through the API on both databases: deploy refusals naming the field, replicas as ordinary workloads
kept at their count by the serving pass, keys hashed at rest and never crossing tenants, the autoscaler's decisions
as events, and the gateway's 401/404/400/503 in OpenAI's shape (no replica here is ever ready: they run on virtual
nodes)."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from suanli.control.caches import FleetCache, PriceCache
from suanli.control.ids import utcnow
from suanli.control.serving import endpoints as endpoints_service
from suanli.control.serving.serving import ServingPass
from suanli.db.models import Workload
from suanli.db.serving import Endpoint, EndpointKey, EndpointLoad
from tests.control_plane import Tenant, signup
from tests.serving_helpers import platform_with_model
from tests.test_workloads_api import Platform

EP = "/api/v1/endpoints"
GPU_SPEC = {"name": "chat", "kind": "service", "model": "tiny", "resources": {"gpu": "H20", "gpus": 2}, "replicas": 2}


@pytest.fixture
def platform(api: TestClient, tmp_path: Path) -> Platform:
    return platform_with_model(api, tmp_path)


def serving(p: Platform) -> ServingPass:
    return ServingPass(endpoints_service.Admitting(5, FleetCache(), PriceCache()))


def deploy(p: Platform, spec: dict[str, Any], who: Tenant | None = None) -> dict[str, Any]:
    r = p.api.post(EP, json={"spec": spec}, headers=(who or p.tenant).headers)
    assert r.status_code == 201, r.text
    return r.json()


def replicas(p: Platform, endpoint_id: str) -> list[Workload]:
    with p.db.read() as s:
        return [w for _, w in endpoints_service.replicas(s, endpoint_id)]


@pytest.mark.parametrize(
    ("change", "status", "field"),
    [
        ({"model": "nope"}, 422, "model:"),
        ({"model": "../../etc"}, 422, "model:"),
        ({"name": "Chat!"}, 422, "name:"),
        ({"replicas": 17}, 422, "replicas:"),
        ({"image": "missing"}, 422, "image:"),
        ({"resources": {"gpu": "H20", "gpus": 4096}}, 422, "resources.gpus:"),
        ({"resources": {"gpu": "B300", "gpus": 1}}, 422, "resources.gpu:"),
        ({"autoscale": {"min_replicas": 2, "max_replicas": 1}, "replicas": None}, 422, "autoscale.max_replicas:"),
        ({"autoscale": {"target": True}, "replicas": None}, 422, "autoscale.target:"),
        ({"price_per_1m_tokens": 0.1}, 422, "price_per_1m_tokens:"),
        ({"env": {"SUANLI_X": "1"}}, 422, "env"),
    ],
)
def test_deploy_refusals_name_the_field(platform: Platform, change: dict, status: int, field: str) -> None:
    spec = {k: v for k, v in {**GPU_SPEC, **change}.items() if v is not None}
    r = platform.api.post(EP, json={"spec": spec}, headers=platform.tenant.headers)
    assert r.status_code == status and field in r.json()["detail"], r.text


def test_hostile_bodies_are_4xx(platform: Platform) -> None:
    h = platform.tenant.headers
    assert platform.api.post(EP, json={"spec_yaml": "x" * 70_000}, headers=h).status_code == 422
    assert platform.api.post(EP, json={"spec_yaml": "[1, 2"}, headers=h).status_code == 422
    assert platform.api.post(EP, json={"spec_yaml": "- a\n- b"}, headers=h).status_code == 422
    assert platform.api.post(EP, json={"spec": {**GPU_SPEC, "name": "a\x00b"}}, headers=h).status_code == 422
    assert platform.api.post(EP, json={"spec": GPU_SPEC, "spec_yaml": "x"}, headers=h).status_code == 422
    assert platform.api.post(EP, json={"spec": GPU_SPEC, "org": "org_nothere"}, headers=h).status_code == 404
    assert platform.api.post(f"{EP}/chat/scale", json={"replicas": "2"}, headers=h).status_code == 422
    assert platform.api.post(f"{EP}/x%00y/scale", json={"replicas": 2}, headers=h).status_code == 422


def test_replicas_are_workloads_kept_at_the_count(platform: Platform) -> None:
    ep = deploy(platform, GPU_SPEC)
    assert (ep["desired"], ep["runtime"], ep["repo_id"]) == (2, "vllm", "acme/tiny")
    sp = serving(platform)
    sp.run(platform.db, utcnow())
    reps = replicas(platform, ep["id"])
    assert len(reps) == 2 and {w.org_id for w in reps} == {platform.tenant.org_id}
    for w in reps:
        assert w.kind == "job" and w.spec["models"] == ["tiny"] and w.spec["resources"]["topology"] == "nvlink"
        assert w.spec["command"].startswith('exec "$(dirname "$(command -v vllm)")/python3" -c ')  # under its guard
        assert " vllm serve acme/tiny --host 127.0.0.1 --port " in w.spec["command"]
        assert w.spec["ports"] == [int(w.spec["command"].split("--port ")[1].split()[0])]
        assert len(w.spec["env"]["REPLICA_KEY"]) == 43 and w.spec["env"]["REPLICA_OPEN_PATH"] == "/health"
    assert len({w.spec["ports"][0] for w in reps}) == 2
    assert len({w.spec["env"]["REPLICA_KEY"] for w in reps}) == 2  # a secret of its own each
    sp.run(platform.db, utcnow())
    assert len(replicas(platform, ep["id"])) == 2  # idempotent
    platform.tick()  # placed and running on virtual nodes: billed like any workload
    assert {platform.get(w.id)["state"] for w in reps} == {"running"}
    r = platform.api.post(f"{EP}/chat/scale", json={"replicas": 1}, headers=platform.tenant.headers)
    assert r.status_code == 200 and r.json()["desired"] == 1
    sp.run(platform.db, utcnow())
    live = [w for w in replicas(platform, ep["id"]) if w.stop_requested is None and w.state == "running"]
    assert len(live) == 1
    ev = platform.api.get(f"{EP}/chat", headers=platform.tenant.headers).json()["events"]
    kinds = [e["kind"] for e in ev]
    assert kinds.count("replica") >= 3 and "scale" in kinds and "deploy" in kinds
    # a replica that ends (killed, failed past its retries) is replaced
    platform.tick()
    with platform.db.write() as s, s.begin():
        s.execute(update(Workload).where(Workload.id == live[0].id).values(stop_requested="test: killed"))
    platform.tick()
    platform.tick()
    sp.run(platform.db, utcnow())
    assert len([w for w in replicas(platform, ep["id"]) if w.state in ("pending", "scheduled", "running")]) == 1


def test_a_longest_name_still_gets_every_replica(platform: Platform) -> None:
    name = "a" * 63  # every replica's name truncates to the same 63 characters
    ep = deploy(platform, {**GPU_SPEC, "name": name, "replicas": 3})
    serving(platform).run(platform.db, utcnow())
    assert len(replicas(platform, ep["id"])) == 3


def test_names_and_endpoints_never_cross_tenants(platform: Platform) -> None:
    ep = deploy(platform, GPU_SPEC)
    r = platform.api.post(EP, json={"spec": GPU_SPEC}, headers=platform.tenant.headers)
    assert r.status_code == 409 and "name" in r.json()["detail"]
    mallory = signup(platform.api, "mallory@example.com")
    platform.topup(mallory.org_id, "5000")
    for how, path, body in [("get", f"{EP}/{ep['id']}", None), ("post", f"{EP}/{ep['id']}/scale", {"replicas": 3}),
                            ("post", f"{EP}/{ep['id']}/keys", {"name": "x", "password": "tenant-password"}), ("get", f"{EP}/{ep['id']}/keys", None),
                            ("delete", f"{EP}/{ep['id']}", None)]:  # fmt: skip
        r = getattr(platform.api, how)(path, headers=mallory.headers, **({"json": body} if body else {}))
        assert r.status_code == 404, (path, r.text)
    assert platform.api.get(EP, headers=mallory.headers).json() == []
    mine = deploy(platform, GPU_SPEC, mallory)  # the same name in another org is another endpoint
    assert mine["id"] != ep["id"]
    assert platform.api.get(f"{EP}/chat", headers=platform.tenant.headers).json()["id"] == ep["id"]


def test_keys_hashed_at_rest_revocable_and_scoped(platform: Platform) -> None:
    ep = deploy(platform, {**GPU_SPEC, "replicas": 0})
    r = platform.api.post(
        f"{EP}/chat/keys", json={"password": "tenant-password", "name": "ci"}, headers=platform.tenant.headers
    )
    assert r.status_code == 201
    key, key_id = r.json()["key"], r.json()["id"]
    assert key.startswith("sk-sl-") and len(key) > 40
    with platform.db.read() as s:
        row = s.get(EndpointKey, key_id)
        assert row is not None and row.token_hash == hashlib.sha256(key.encode()).hexdigest()
        assert key not in str([getattr(row, c) for c in ("id", "name", "prefix", "token_hash")])
    listed = platform.api.get(f"{EP}/chat/keys", headers=platform.tenant.headers).json()
    assert [k["key"] for k in listed] == [None]
    with platform.db.read() as s:
        assert endpoints_service.authenticate_key(s, key).endpoint_id == ep["id"]
    mallory = signup(platform.api, "mallory@example.com")
    assert platform.api.delete(f"/api/v1/endpoint-keys/{key_id}", headers=mallory.headers).status_code == 404
    assert platform.api.delete(f"/api/v1/endpoint-keys/{key_id}", headers=platform.tenant.headers).status_code == 200
    from suanli.control.errors import Unauthorized

    with platform.db.read() as s, pytest.raises(Unauthorized):
        endpoints_service.authenticate_key(s, key)


def test_gateway_errors_in_openai_shape(platform: Platform) -> None:
    deploy(platform, {**GPU_SPEC, "replicas": None, "autoscale": {"min_replicas": 0, "max_replicas": 1,
                                                                  "cold_start_s": 1}})  # fmt: skip
    key = platform.api.post(
        f"{EP}/chat/keys", json={"password": "tenant-password"}, headers=platform.tenant.headers
    ).json()["key"]
    h = {"Authorization": f"Bearer {key}"}
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    for bad in ({}, {"Authorization": "Bearer sk-sl-nope"}, {"Authorization": "Basic x"}, platform.tenant.headers):
        r = platform.api.post("/v1/chat/completions", json=body, headers=bad)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
    r = platform.api.post("/v1/chat/completions", json={**body, "model": "other"}, headers=h)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = platform.api.post("/v1/chat/completions", json={**body, "n": 1000}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = platform.api.post("/v1/chat/completions", json=body, headers=h)  # nobody serves: a bounded wait, then 503
    assert r.status_code == 503 and r.headers["retry-after"] == "5" and "cold start" in r.json()["error"]["message"]
    assert platform.api.get("/v1/models", headers=h).json()["data"][0]["id"] == "chat"


def test_autoscaler_decisions_are_events(platform: Platform) -> None:
    ep = deploy(platform, {**GPU_SPEC, "replicas": None, "resources": {"gpu": "H20", "gpus": 1},
                           "autoscale": {"min_replicas": 0, "max_replicas": 3, "target": 2, "idle_s": 30}})  # fmt: skip
    assert ep["desired"] == 0
    sp, now = serving(platform), utcnow()
    with platform.db.write() as s, s.begin():
        s.add(EndpointLoad(endpoint_id=ep["id"], worker="w1", inflight=3, waiting=2, last_request_at=now,
                           updated_at=now))  # fmt: skip
    sp.run(platform.db, now)
    assert len(replicas(platform, ep["id"])) == 3
    with platform.db.write() as s, s.begin():  # load gone, the last request 31 s ago, the last change too
        s.execute(update(EndpointLoad).values(inflight=0, waiting=0, last_request_at=now - timedelta(seconds=31)))
        s.execute(update(Endpoint).where(Endpoint.id == ep["id"]).values(changed_at=now - timedelta(seconds=31),
                                                                          busy_at=now - timedelta(seconds=31)))  # fmt: skip
    sp.run(platform.db, now)
    with platform.db.read() as s:
        e = s.get(Endpoint, ep["id"])
        assert e is not None and e.desired == 0
        reasons = [x.reason for x in endpoints_service.events(s, ep["id"]) if x.kind == "scale"]
        assert any("5 request(s)" in x and "0 → 3" in x for x in reasons), reasons
        assert any("idle" in x and "3 → 0" in x for x in reasons), reasons
        stopping = s.scalars(select(Workload).where(Workload.id.in_([w.id for w in replicas(platform, ep["id"])])))
        assert all(w.state == "stopped" or w.stop_requested for w in stopping)


def test_remove_stops_replicas_and_deletes_keys(platform: Platform) -> None:
    ep = deploy(platform, GPU_SPEC)
    serving(platform).run(platform.db, utcnow())
    platform.api.post(f"{EP}/chat/keys", json={"password": "tenant-password"}, headers=platform.tenant.headers)
    assert platform.api.delete(f"{EP}/chat", headers=platform.tenant.headers).status_code == 200
    with platform.db.read() as s:
        assert s.scalars(select(EndpointKey).where(EndpointKey.endpoint_id == ep["id"])).all() == []
        ws = s.scalars(select(Workload).where(Workload.name.like("chat-r%"))).all()
        assert len(ws) == 2 and all(w.state == "stopped" or w.stop_requested for w in ws)
    assert platform.api.get(f"{EP}/chat", headers=platform.tenant.headers).status_code == 404


def _usage(p: Platform, endpoint_id: str, key_id: str, minute: Any, prompt: int, completion: int) -> None:
    from suanli.control.serving import gateway as store

    store.report(p.db, "w", {}, [(endpoint_id, key_id, minute, 1, prompt, completion)], utcnow())


def _balance(p: Platform, org_id: str) -> Decimal:
    from suanli.control.money import ledger

    with p.db.read() as s:
        return ledger.org_balance(s, org_id)


def test_another_orgs_key_pays_the_owner_per_token_exactly_once(platform: Platform) -> None:
    from suanli.control.serving import token_billing

    priced = deploy(platform, {**GPU_SPEC, "replicas": 0, "price_per_1m_tokens": "2.50"})
    deploy(platform, {**GPU_SPEC, "name": "free", "replicas": 0})
    free_id = platform.api.get(f"{EP}/free", headers=platform.tenant.headers).json()["id"]
    mallory = signup(platform.api, "mallory@example.com")
    r = platform.api.post(f"{EP}/chat/keys", json={"password": "tenant-password"}, headers=mallory.headers)
    assert r.status_code == 404  # by name: her own orgs' endpoints only
    assert (
        platform.api.post(
            f"{EP}/{free_id}/keys", json={"password": "tenant-password"}, headers=mallory.headers
        ).status_code
        == 404
    )
    r = platform.api.post(
        f"{EP}/{priced['id']}/keys",
        json={"password": "tenant-password", "org": platform.tenant.org_id},
        headers=mallory.headers,
    )
    assert r.status_code == 404  # she cannot make the owner pay
    r = platform.api.post(
        f"{EP}/{priced['id']}/keys", json={"password": "tenant-password", "name": "buyer"}, headers=mallory.headers
    )
    assert r.status_code == 201 and r.json()["org_id"] == mallory.org_id
    theirs = r.json()["id"]
    own = platform.api.post(
        f"{EP}/chat/keys", json={"password": "tenant-password"}, headers=platform.tenant.headers
    ).json()["id"]
    old = (utcnow() - timedelta(minutes=5)).replace(second=0, microsecond=0)
    _usage(platform, priced["id"], theirs, old, 123_457, 654_321)
    _usage(platform, priced["id"], own, old, 10**6, 10**6)  # the owner's own key: its GPUs are its price
    _usage(platform, priced["id"], theirs, utcnow().replace(second=0, microsecond=0), 5, 5)  # this minute: later
    owner0, buyer0 = _balance(platform, platform.tenant.org_id), _balance(platform, mallory.org_id)
    assert token_billing.charge(platform.db, utcnow()) == 1
    assert token_billing.charge(platform.db, utcnow()) == 0  # once
    due = Decimal("1.944445")  # 777,778 tokens at 2.50 per 1M, exact
    assert _balance(platform, mallory.org_id) == buyer0 - due
    assert _balance(platform, platform.tenant.org_id) == owner0 + due
    _usage(platform, priced["id"], theirs, old, 1, 0)  # a late report for the same minute: only the rest is charged
    assert token_billing.charge(platform.db, utcnow()) == 1
    assert _balance(platform, mallory.org_id) == buyer0 - Decimal("1.9444475")
    rows = platform.api.get(f"{EP}/{priced['id']}/usage", headers=platform.tenant.headers).json()
    paid = {
        (r["key_id"], r["charged_tokens"], r["charged"]) for r in rows if r["minute"].startswith(old.isoformat()[:16])
    }
    assert paid == {(theirs, 777_779, "1.94444750"), (own, 0, "0.00000000")}  # what the ledger took, per row
    from suanli.control.money import ledger

    with platform.db.read() as s:
        assert all(a == b for a, b in ledger.recompute(s).values())  # every balance is its entries
    # the owner may cut the buyer off; another tenant may not
    assert platform.api.delete(f"/api/v1/endpoint-keys/{theirs}", headers=platform.tenant.headers).status_code == 200


def test_a_buyer_out_of_money_is_refused_with_402(platform: Platform) -> None:
    from suanli.control.serving import token_billing

    priced = deploy(platform, {**GPU_SPEC, "replicas": 0, "price_per_1m_tokens": "1000"})
    mallory = signup(platform.api, "mallory@example.com")
    key = platform.api.post(
        f"{EP}/{priced['id']}/keys", json={"password": "tenant-password"}, headers=mallory.headers
    ).json()
    _usage(platform, priced["id"], key["id"], utcnow() - timedelta(minutes=5), 10**6, 10**6)  # ¥2,000 of tokens
    token_billing.charge(platform.db, utcnow())
    assert _balance(platform, mallory.org_id) == 0  # charged what she had, never past it: money moves, it is not made
    r = platform.api.post("/v1/completions", json={"model": "chat", "prompt": "x"},
                          headers={"Authorization": f"Bearer {key['key']}"})  # fmt: skip
    assert r.status_code == 402 and "top up" in r.json()["error"]["message"]


def test_an_owner_cannot_set_their_replicas_secret_or_open_path_through_the_endpoints_env(platform: Platform) -> None:
    """The replica's secret and the one path it answers without it are the platform's: an endpoint's `env` naming
    them (to know the secret, or to open a model route to anyone on the node) is overridden, not obeyed."""
    spec = {**GPU_SPEC, "name": "sly", "replicas": 1,
            "env": {"REPLICA_KEY": "chosen", "REPLICA_OPEN_PATH": "/v1/completions", "VLLM_API_KEY": "chosen"}}  # fmt: skip
    ep = deploy(platform, spec)
    serving(platform).run(platform.db, utcnow())
    (w,) = replicas(platform, ep["id"])
    assert w.spec["env"]["REPLICA_KEY"] not in ("chosen", "") and len(w.spec["env"]["REPLICA_KEY"]) == 43
    assert w.spec["env"]["REPLICA_OPEN_PATH"] == "/health"
