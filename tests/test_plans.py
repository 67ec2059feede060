"""Reserved plans: paid upfront from the balance, once per idempotency key, at the price book's discount, and
only for capacity that exists (issue: a daily plan of 1,000 x H20 was sold on a cluster of 128 H20)."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from suanli.api import deps
from suanli.billing.prices import default_price_book
from suanli.control.accounts import accounts
from suanli.control.errors import Conflict
from suanli.control.ids import utcnow
from suanli.control.money import ledger, metering, plans
from suanli.control.scheduling import inventory
from suanli.db.engine import Database
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"


def test_a_plan_is_paid_upfront_once_per_key_and_never_overdraws(api) -> None:  # type: ignore[no-untyped-def]
    admin = bearer(admin_token(api))
    api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=admin).raise_for_status()
    t = signup(api, "p@example.com")
    plans_url = f"/api/v1/orgs/{t.org_id}/plans"
    body = {"plan": "daily", "gpu": "H20", "gpus": 8, "key": "k1"}
    r = api.post(plans_url, json=body, headers=t.headers)
    assert r.status_code == 402 and "balance" in r.json()["detail"]  # ¥10 of trial credit buys no day of 8 H20
    assert api.get(plans_url, headers=t.headers).json() == []

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


def _offer(api: Any, who: Tenant) -> dict[str, Any]:
    (h20,) = [o for o in api.get(f"{API}/offers", headers=who.headers).json() if o["gpu"] == "H20"]
    return dict(h20)


def _buy(api: Any, who: Tenant, gpus: int, plan: str = "daily", status: int = 201) -> dict[str, Any]:
    r = api.post(f"{API}/orgs/{who.org_id}/plans", json={"plan": plan, "gpu": "H20", "gpus": gpus}, headers=who.headers)
    assert r.status_code == status, r.text
    return dict(r.json())


def test_plans_reserve_only_gpus_that_exist_and_offers_show_them_taken(api: Any, monkeypatch: Any) -> None:
    admin = bearer(admin_token(api))
    api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=admin).raise_for_status()
    a, b = signup(api, "a@example.com"), signup(api, "b@example.com")
    for t in (a, b):
        api.post(f"{API}/admin/orgs/{t.org_id}/transactions", json={"amount": "100000"},
                 headers=admin).raise_for_status()  # fmt: skip
    detail = _buy(api, a, 1000, status=409)["detail"]
    assert detail.startswith("gpus: 1000 x H20 asked; 16 of the 16 H20 GPUs in service are left"), detail
    assert _offer(api, a)["free"] == 16  # nothing was sold, nothing paid
    assert api.get(f"{API}/orgs/{a.org_id}/balance", headers=a.headers).json()["balance"] == "100010.00"

    first = _buy(api, a, 10)
    o = _offer(api, b)
    assert (o["total"], o["free"], o["reserved"]) == (16, 6, 10)
    assert o["largest_free_nvlink"] <= 6 and o["largest_free_leaf"] <= 6
    assert "6 of the 16 H20 GPUs in service are left" in _buy(api, b, 7, plan="hourly", status=409)["detail"]
    _buy(api, b, 6, plan="hourly")
    assert (_offer(api, a)["free"], _offer(api, a)["reserved"]) == (0, 16)

    # The plan's own work on its GPUs: they are held, no longer idle; the offer stays at 0 free.
    db = api.app.state.server.db
    node = api.get(f"{API}/admin/nodes", headers=admin).json()[0]["name"]
    with db.write() as s, s.begin():
        metering.open_allocation(s, org_id=a.org_id, user_id=a.user_id, workload="on-plan", gpu_model="H20", gpus=8,
                                 placement={node: list(range(8))}, now=utcnow(), hold_minutes=0,
                                 mode=f"plan:{first['id']}", rate=Decimal(0))  # fmt: skip
    assert (_offer(api, a)["free"], _offer(api, a)["reserved"]) == (0, 16)

    # Two hours on, the hourly plan has ended: its 6 GPUs are free to sell again, and shown so.
    later = utcnow() + timedelta(hours=2)
    monkeypatch.setattr(deps, "utcnow", lambda: later)
    assert (_offer(api, a)["free"], _offer(api, a)["reserved"]) == (6, 10)
    assert "6 of the 16" in _buy(api, b, 7, status=409)["detail"]
    # A drained node is no capacity to sell: 8 GPUs in service, all reserved.
    api.patch(f"{API}/admin/nodes/{node}", json={"state": "draining"}, headers=admin).raise_for_status()
    assert "0 of the 8 H20 GPUs in service are left" in _buy(api, b, 1, status=409)["detail"]


@pytest.fixture
def buyers(db: Database) -> list[tuple[str, str]]:
    now = utcnow()
    out = []
    with db.write() as s, s.begin():
        inventory.register_preset(s, "2x8:H20", now)
        for i in range(8):
            user, org = accounts.create_user(s, f"buyer{i}@example.com", "password123", now)
            ledger.move(s, "topup", org.id, "100000", f"top{i}", now)
            out.append((org.id, user.id))
    return out


def _race(db: Database, buyers: list[tuple[str, str]], gpus: int, key: str | None) -> list[Any]:
    """Every buyer at once (a barrier), each in its own transaction: the plan bought or the Conflict refused."""
    gate = threading.Barrier(len(buyers))
    out: list[Any] = [None] * len(buyers)

    def one(i: int) -> None:
        org, user = buyers[i]
        gate.wait()
        try:
            with db.write() as s, s.begin():
                out[i] = plans.buy(s, org, user, "daily", "H20", gpus, utcnow(), key).id
        except Conflict as e:
            out[i] = e
        except Exception as e:  # reported with the others
            out[i] = repr(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(buyers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return out


def test_concurrent_purchases_never_oversell(db: Database, buyers: list[tuple[str, str]]) -> None:
    """Eight buyers of 3 H20 each at once on 16: five are sold (15 GPUs), three are refused naming what is left."""
    out = _race(db, buyers, 3, None)
    sold = [x for x in out if isinstance(x, str) and x.startswith("plan_")]
    refused = [x for x in out if isinstance(x, Conflict)]
    assert (len(sold), len(refused)) == (5, 3), out
    assert all("1 of the 16 H20 GPUs in service are left" in e.message for e in refused)
    with db.read() as s:
        now = utcnow()
        assert plans.reserved(s, "H20", now, now + timedelta(days=1)) == 15
        assert ledger.recompute(s) == {}


def test_one_key_bought_at_once_from_six_requests_buys_once(db: Database, buyers: list[tuple[str, str]]) -> None:
    """The same org retrying one key six times at once gets the one plan six times (PostgreSQL answered 409)."""
    out = _race(db, [buyers[0]] * 6, 2, "once")
    assert len(set(out)) == 1 and str(out[0]).startswith("plan_"), out
    with db.read() as s:
        assert len(plans.of_org(s, buyers[0][0])) == 1
