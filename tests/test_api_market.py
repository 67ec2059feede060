"""The market over HTTP: registering inventory, what is on offer and at what price, quotes, operator money.

Every test runs in-process on SQLite and on PostgreSQL (the `api` fixture)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from fastapi.routing import APIRoute

from suanli.telemetry import nvml
from suanli.topology import presets
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"
PRESET = "h20-roce800-128"
JOB = {"model": "llama3.1-8b", "seq_len": 4096, "global_batch": 256}


@pytest.fixture
def market(api: Any) -> tuple[Any, dict[str, str], Tenant]:
    """The API with the preset registered: (client, admin headers, a tenant)."""
    adm = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": PRESET}, headers=adm)
    assert r.status_code == 201, r.text
    return api, adm, signup(api, "tenant@example.com")


def _offer(api: Any, who: Tenant, gpu: str = "H20") -> dict[str, Any]:
    r = api.get(f"{API}/offers", headers=who.headers)
    assert r.status_code == 200, r.text
    rows = [o for o in r.json() if o["gpu"] == gpu]
    assert len(rows) == 1, r.json()
    return rows[0]


def _quotes(api: Any, who: Tenant, **body: Any) -> list[dict[str, Any]]:
    r = api.post(f"{API}/quotes", json={**JOB, **body}, headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()


def _detail(r: Any) -> str:
    assert isinstance(r.json().get("detail"), str), r.text
    return r.json()["detail"]


# ---- offers ---------------------------------------------------------------------------------------------------
def test_preset_offer_counts_blocks_and_price_book_price(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, _, t = market
    spec = presets.preset_spec(PRESET)
    (group,) = spec["node_groups"]
    total = group["count"] * group["gpus_per_node"]
    o = _offer(api, t)
    assert (o["total"], o["free"], o["nodes"]) == (total, total, group["count"])
    assert o["largest_free_nvlink"] == group["gpus_per_node"] == 8  # one 8-GPU board per NVLink domain
    assert o["largest_free_leaf"] == min(group["count"], spec["nodes_per_leaf"]) * group["gpus_per_node"]
    book = api.get(f"{API}/prices", headers=t.headers).json()
    price = Decimal(book["gpu_hour"]["H20"])
    assert Decimal(o["on_demand_per_gpu_hour"]) == price and o["currency"] == book["currency"] == "CNY"
    assert Decimal(o["spot_per_gpu_hour"]) == price * Decimal(book["spot_factor"])
    for name, plan in book["plans"].items():
        assert Decimal(o["plans_per_gpu_hour"][name]) == price * (1 - Decimal(plan["discount"]))


def test_draining_frees_less_and_down_counts_less(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, adm, t = market
    before = _offer(api, t)
    nodes = api.get(f"{API}/admin/nodes", params={"cluster": PRESET}, headers=adm).json()
    assert len(nodes) == before["nodes"] and all(n["state"] == "ready" for n in nodes)

    r = api.patch(f"{API}/admin/nodes/{nodes[0]['name']}", json={"state": "draining", "reason": "disk"}, headers=adm)
    assert r.status_code == 200 and (r.json()["state"], r.json()["state_reason"]) == ("draining", "disk")
    drained = _offer(api, t)
    assert (drained["total"], drained["free"]) == (before["total"], before["free"] - 8)
    assert drained["largest_free_leaf"] == before["largest_free_leaf"] - 8

    r = api.patch(f"{API}/admin/nodes/{nodes[1]['id']}", json={"state": "down"}, headers=adm)
    assert r.status_code == 200, r.text
    down = _offer(api, t)
    assert (down["total"], down["free"], down["nodes"]) == (
        before["total"] - 8,
        before["free"] - 16,
        before["nodes"] - 1,
    )

    for n in nodes[:2]:
        assert api.patch(f"{API}/admin/nodes/{n['id']}", json={"state": "ready"}, headers=adm).status_code == 200
    assert _offer(api, t) == before
    assert api.patch(f"{API}/admin/nodes/no-such-node", json={"state": "down"}, headers=adm).status_code == 404


def test_admin_price_change_moves_the_offer_and_versions_the_book(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, adm, t = market
    v0 = api.get(f"{API}/prices", headers=t.headers).json()["version"]
    r = api.put(f"{API}/admin/prices/gpus/H20", json={"on_demand": "9.25"}, headers=adm)
    assert r.status_code == 200, r.text
    assert r.json()["version"] > v0 and Decimal(r.json()["gpu_hour"]["H20"]) == Decimal("9.25")
    book = api.get(f"{API}/prices", headers=t.headers).json()
    assert book["version"] == r.json()["version"]
    assert _offer(api, t)["on_demand_per_gpu_hour"] == "9.25000000"
    (cheapest,) = _quotes(api, t, tokens=1e9, gpu="H20", gpus=8, limit=1)
    assert Decimal(cheapest["rate_per_hour"]) == Decimal("9.25") * 8

    r = api.put(f"{API}/admin/prices/gpus/H20", json={"remove": True}, headers=adm)
    assert r.status_code == 200 and "H20" not in r.json()["gpu_hour"] and r.json()["version"] > book["version"]
    o = _offer(api, t)
    assert (o["on_demand_per_gpu_hour"], o["spot_per_gpu_hour"], o["plans_per_gpu_hour"]) == (None, None, {})
    assert o["total"] == 128, "an unpriced model is still inventory, it just cannot be rented"
    assert _quotes(api, t, tokens=1e9) == []
    r = api.put(f"{API}/admin/prices/gpus/NoSuchGPU", json={"on_demand": "1"}, headers=adm)
    assert r.status_code == 422 and _detail(r).startswith("gpu")


# ---- quotes ---------------------------------------------------------------------------------------------------
def test_quotes_rank_by_cost_or_by_time(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, _, t = market
    cheapest = _quotes(api, t, tokens=2e9, rank="cheapest")
    fastest = _quotes(api, t, tokens=2e9, rank="fastest")
    assert len(cheapest) >= 3 and len(fastest) >= 3
    costs = [Decimal(q["cost"]) for q in cheapest]
    assert costs == sorted(costs)
    times = [q["total_time_s"] for q in fastest]
    assert times == sorted(times)
    assert fastest[0]["total_time_s"] <= min(q["total_time_s"] for q in cheapest)
    assert Decimal(cheapest[0]["cost"]) <= min(Decimal(q["cost"]) for q in fastest)
    for q in cheapest:
        assert q["cluster"] == PRESET and q["gpu"] == "H20" and q["currency"] == "CNY" and q["available_now"]
        hours = Decimal(str(q["total_time_s"])) / 3600
        assert abs(Decimal(q["rate_per_hour"]) * hours - Decimal(q["cost"])) <= Decimal(q["cost"]) * Decimal("0.001")


def test_fixed_gpu_count_and_limit(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, _, t = market
    for n in (8, 32):
        rows = _quotes(api, t, tokens=1e9, gpus=n)
        assert rows and {q["gpus"] for q in rows} == {n}
    assert len(_quotes(api, t, tokens=1e9, limit=2)) == 2
    assert _quotes(api, t, tokens=1e9, gpus=256) == [], "more GPUs than the cluster has"


def test_steps_and_the_same_number_of_tokens_quote_the_same(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, _, t = market
    steps = 500
    by_steps = _quotes(api, t, steps=steps)
    by_tokens = _quotes(api, t, tokens=steps * JOB["global_batch"] * JOB["seq_len"])
    assert by_steps and by_steps == by_tokens
    doubled = _quotes(api, t, steps=2 * steps, gpus=by_steps[0]["gpus"], limit=1)[0]
    assert doubled["total_time_s"] == pytest.approx(2 * by_steps[0]["total_time_s"], rel=1e-3)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "no-such-model", "tokens": 1e9}, "model"),
        ({**JOB, "gpu": "NoSuchGPU", "tokens": 1e9}, "gpu"),
        ({**JOB}, "body"),  # neither tokens nor steps
        ({**JOB, "tokens": 1e9, "steps": 10}, "body"),
        ({**JOB, "tokens": 1e9, "rank": "best"}, "rank"),
        ({**JOB, "tokens": 1e9, "billing_mode": "free"}, "billing_mode"),
    ],
)
def test_bad_quote_is_422_naming_the_field(market: tuple[Any, dict[str, str], Tenant], body: dict, field: str) -> None:
    api, _, t = market
    r = api.post(f"{API}/quotes", json=body, headers=t.headers)
    assert r.status_code == 422, r.text
    assert _detail(r).startswith(field) or (field == "body" and "tokens and steps" in _detail(r)), r.text


# ---- inventory ------------------------------------------------------------------------------------------------
def test_register_a_spec_document(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, adm, t = market
    spec = {"name": "l40s-lab", "node_groups": [{"name": "l40s", "count": 3, "gpu": "L40S", "gpus_per_node": 4}],
            "fabric": "eth-25"}  # fmt: skip
    r = api.post(f"{API}/admin/clusters", json={"spec": spec}, headers=adm)
    assert r.status_code == 201, r.text
    assert (r.json()["name"], r.json()["source"], r.json()["nodes"], r.json()["gpus"]) == ("l40s-lab", "spec", 3, 12)
    o = _offer(api, t, "L40S")
    assert (o["total"], o["free"], o["nodes"], o["largest_free_nvlink"]) == (12, 12, 3, 4)
    node = api.get(f"{API}/admin/nodes", params={"cluster": "l40s-lab", "limit": 1}, headers=adm).json()[0]
    detail = api.get(f"{API}/admin/nodes/{node['name']}", headers=adm).json()
    assert [g["index"] for g in detail["gpus"]] == [0, 1, 2, 3] and {g["model"] for g in detail["gpus"]} == {"L40S"}
    bad = api.post(f"{API}/admin/clusters", json={"spec": {**spec, "name": "x", "node_groups": []}}, headers=adm)
    assert bad.status_code == 422 and _detail(bad).startswith("spec"), bad.text
    assert api.delete(f"{API}/admin/clusters/l40s-lab", headers=adm).status_code == 204
    assert "L40S" not in {o["gpu"] for o in api.get(f"{API}/offers", headers=t.headers).json()}


def test_register_this_host(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, adm, t = market
    host = nvml.discover()
    offers_before = api.get(f"{API}/offers", headers=t.headers).json()
    r = api.post(f"{API}/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm)
    assert r.status_code == 201, r.text
    assert (r.json()["source"], r.json()["nodes"], r.json()["gpus"]) == ("local", 1, len(host.gpus))
    (node,) = api.get(f"{API}/admin/nodes", params={"cluster": "this-host"}, headers=adm).json()
    assert node["kind"] == "local" and node["cpu_count"] >= 1 and node["memory_mib"] > 0
    if not host.gpus:  # this machine (and CI) has no GPU: a CPU-only node that says why, and nothing to rent
        assert (node["gpu_model"], node["gpu_count"]) == (None, 0)
        assert "CPU-only" in node["state_reason"]
        assert api.get(f"{API}/offers", headers=t.headers).json() == offers_before
    else:
        assert node["gpu_count"] == len(host.gpus) and node["gpu_model"] is not None
        assert node["gpu_model"] in {o["gpu"] for o in api.get(f"{API}/offers", headers=t.headers).json()}


def test_duplicate_cluster_name_is_a_conflict(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, adm, _ = market
    for body in ({"preset": PRESET}, {"preset": "2x8:H100", "name": PRESET}, {"local": True, "name": PRESET}):
        r = api.post(f"{API}/admin/clusters", json=body, headers=adm)
        assert r.status_code == 409, (body, r.text)
        assert _detail(r).startswith("name"), r.text
    assert len(api.get(f"{API}/admin/clusters", headers=adm).json()) == 1


# ---- operator money and rights ------------------------------------------------------------------------------------
def test_topup_with_the_same_key_posts_once(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, adm, t = market
    url = f"{API}/admin/orgs/{t.org_id}/transactions"
    first = api.post(url, json={"amount": "5.00", "key": "wire-42", "memo": "bank wire"}, headers=adm)
    again = api.post(url, json={"amount": "5.00", "key": "wire-42", "memo": "bank wire"}, headers=adm)
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert first.json() == again.json() and first.json()["amount"] == "5.00000000"
    assert api.get(f"{API}/orgs/{t.org_id}/balance", headers=t.headers).json()["balance"] == "15.00"
    txs = api.get(f"{API}/orgs/{t.org_id}/transactions", headers=t.headers).json()
    assert [x["kind"] for x in txs] == ["topup", "trial_credit"]
    clash = api.post(url, json={"amount": "7.00", "key": "wire-42"}, headers=adm)
    assert clash.status_code == 409 and "wire-42" in _detail(clash)
    by_name = api.post(f"{API}/admin/orgs/{t.email}/transactions", json={"amount": "1", "kind": "credit"}, headers=adm)
    assert by_name.status_code == 201 and by_name.json()["kind"] == "credit"
    assert api.get(f"{API}/orgs/{t.org_id}/balance", headers=t.headers).json()["balance"] == "16.00"
    assert api.get(f"{API}/admin/ledger/check", headers=adm).json() == {"ok": True, "mismatches": {}}


def test_non_admin_gets_403_on_every_admin_route(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, _, t = market
    routes = [r for r in api.app.routes if isinstance(r, APIRoute) and r.path.startswith(f"{API}/admin/")]
    if not routes:  # newer FastAPI wraps included routers; walk what it resolves
        from fastapi.routing import iter_route_contexts

        routes = [rc for rc in iter_route_contexts(api.app.routes) if str(rc.path).startswith(f"{API}/admin/")]
    assert len(routes) >= 10
    walked = 0
    for route in routes:
        path = route.path.replace("{", "").replace("}", "")  # any value: the role is checked first
        for method in route.methods:
            r = api.request(method, path, json={}, headers=t.headers)
            assert r.status_code == 403, (method, route.path, r.text)
            assert "admin" in _detail(r)
            walked += 1
    assert walked == len(routes)


# ---- training precisions beyond bf16/fp16/fp8/fp32 -------------------------------------------------------------
def test_new_precisions_quote_where_the_gpu_has_them_and_name_the_field_where_not(
    market: tuple[Any, dict[str, str], Tenant],
) -> None:
    """H20 (Hopper) has FP8 tensor cores but no FP4: nvfp4 on it is the caller's mistake (422 naming precision),
    never a server error; any other GPU simply has no quote; fp8-blockwise runs at the FP8 rate."""
    api, _, who = market
    r = api.post(f"{API}/quotes", json={**JOB, "tokens": 1e9, "precision": "nvfp4", "gpu": "H20"}, headers=who.headers)
    assert r.status_code == 422 and _detail(r).startswith("precision: H20 has no fp4"), r.text
    assert _quotes(api, who, tokens=1e9, precision="nvfp4") == []  # "any": no offer can, none is quoted
    fp8 = _quotes(api, who, tokens=1e9, precision="fp8", gpus=8)
    blockwise = _quotes(api, who, tokens=1e9, precision="fp8-blockwise", gpus=8)
    assert fp8 and blockwise and Decimal(blockwise[0]["cost"]) >= Decimal(fp8[0]["cost"])  # scaling costs, never saves
    r = api.post(f"{API}/quotes", json={**JOB, "tokens": 1e9, "precision": "int4"}, headers=who.headers)
    assert r.status_code == 422 and _detail(r).startswith("precision:")


def test_mxfp8_before_blackwell_is_refused_naming_the_field(market: tuple[Any, dict[str, str], Tenant]) -> None:
    """MX block scaling is a Blackwell tensor-core feature: mxfp8 asked of a Hopper GPU (the H20 on offer, or an
    H100 named) is a 422 naming precision, and the Hopper offer is skipped when any GPU may serve, never quoted at
    the FP8 rate as before."""
    api, _, who = market
    for gpu in ("H20", "H100-SXM"):
        body = {**JOB, "tokens": 1e9, "precision": "mxfp8", "gpu": gpu}
        r = api.post(f"{API}/quotes", json=body, headers=who.headers)
        assert r.status_code == 422, r.text
        assert _detail(r).startswith(f"precision: {gpu} has no mxfp8") and "Blackwell" in _detail(r), r.text
    assert _quotes(api, who, tokens=1e9, precision="mxfp8") == []
    assert _quotes(api, who, tokens=1e9, precision="fp8", gpus=8)  # the same offer quotes the recipes it runs
