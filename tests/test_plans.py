"""Reserved plans: paid upfront from the balance, once per idempotency key, at the price book's discount."""

from __future__ import annotations

from decimal import Decimal

from suanli.billing.prices import default_price_book
from tests.control_plane import admin_token, bearer, signup


def test_a_plan_is_paid_upfront_once_per_key_and_never_overdraws(api) -> None:  # type: ignore[no-untyped-def]
    t = signup(api, "p@example.com")
    plans_url = f"/api/v1/orgs/{t.org_id}/plans"
    body = {"plan": "daily", "gpu": "H20", "gpus": 8, "key": "k1"}
    r = api.post(plans_url, json=body, headers=t.headers)
    assert r.status_code == 402 and "balance" in r.json()["detail"]  # ¥10 of trial credit buys no day of 8 H20
    assert api.get(plans_url, headers=t.headers).json() == []

    admin = bearer(admin_token(api))
    api.post(f"/api/v1/admin/orgs/{t.org_id}/transactions", json={"amount": "5000"}, headers=admin).raise_for_status()
    first = api.post(plans_url, json=body, headers=t.headers)
    again = api.post(plans_url, json=body, headers=t.headers)
    assert first.status_code == 201 and again.json()["id"] == first.json()["id"]

    book = default_price_book()
    expected = book.gpu_hour["H20"] * 8 * 24 * (1 - book.plans["daily"].discount)
    plan = first.json()
    assert Decimal(plan["price"]) == expected and plan["active"] and plan["gpu_model"] == "H20"
    balance = api.get(f"/api/v1/orgs/{t.org_id}/balance", headers=t.headers).json()
    assert Decimal(balance["exact"]) == Decimal("5010") - expected

    kinds = [tx["kind"] for tx in api.get(f"/api/v1/orgs/{t.org_id}/transactions", headers=t.headers).json()]
    assert kinds.count("plan_purchase") == 1
    assert api.get("/api/v1/admin/ledger/check", headers=admin).json()["ok"]

    assert api.post(plans_url, json={**body, "gpus": 4}, headers=t.headers).status_code == 409  # key reused
    bad = api.post(plans_url, json={"plan": "yearly", "gpu": "H20", "gpus": 1}, headers=t.headers)
    assert bad.status_code == 422 and "plan" in bad.json()["detail"]
    bad = api.post(plans_url, json={"plan": "daily", "gpu": "nope", "gpus": 1}, headers=t.headers)
    assert bad.status_code == 422 and "gpu" in bad.json()["detail"]
    assert len(api.get(plans_url, headers=t.headers).json()) == 1
