"""Operator reports: revenue by day and GPU model (exact money), waste (idle GPU-hours) by hour; operators only;
on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import update

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.control.money import ledger
from suanli.db.engine import Database
from suanli.db.models import Allocation, Node
from tests.control_plane import admin_token, bearer, signup


def _charge(db: Database, org: str, user: str, alloc: str, model: str | None, amount: str, now: datetime) -> None:
    with db.write() as s, s.begin():
        if s.get(Allocation, alloc) is None:
            s.add(Allocation(id=alloc, org_id=org, user_id=user, workload=alloc, gpu_model=model, gpus=8 if model else 0,
                             rate_per_hour=Decimal(10), placement={}, started_at=now - timedelta(hours=2),
                             stopped_at=now - timedelta(hours=1)))  # fmt: skip
        tx = transfer(f"usage:{alloc}:{amount}", "usage", org_account(org), REVENUE, Decimal(amount))
        ledger.post(s, tx, now, org_id=org, user_id=user, allocation_id=alloc, allow_negative=[org_account(org)])


def test_revenue_by_day_and_model_is_exact(api: Any, db_url: str, api_clock: Callable[[datetime], None]) -> None:
    t = signup(api, "payer@example.com")
    db, now = Database(db_url), datetime.now(UTC)
    api_clock(now)  # the days asked for are the ones the money was posted in, even across midnight
    for alloc, model, amount in (("a1", "H100-SXM", "0.10000001"), ("a1", "H100-SXM", "0.20000002"),
                                 ("a2", "H20", "1.5"), ("a3", None, "0.00000003")):  # fmt: skip
        _charge(db, t.org_id, t.user_id, alloc, model, amount, now)
    r = api.post(f"/api/v1/admin/orgs/{t.org_id}/transactions", json={"kind": "refund", "amount": "0.5"},
                 headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 201, r.text
    r = api.get("/api/v1/admin/revenue", params={"days": 3}, headers=bearer(admin_token(api)))
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["day"] for d in body["days"]] == [(now - timedelta(days=i)).date().isoformat() for i in (2, 1, 0)]
    today = body["days"][-1]
    assert today["by"] == {"H100-SXM": "0.30000003", "H20": "1.50000000", "CPU": "0.00000003",
                           "refund": "-0.50000000"}  # fmt: skip
    assert today["total"] == body["total"] == "1.30000006"
    assert body["days"][0] == {"day": body["days"][0]["day"], "total": "0.00000000", "by": {}}


def test_waste_by_hour_counts_held_and_idle_gpu_hours(api: Any, db_url: str,
                                                      api_clock: Callable[[datetime], None]) -> None:  # fmt: skip
    admin = bearer(admin_token(api))
    assert api.post("/api/v1/admin/clusters", json={"preset": "rtx4090-box"}, headers=admin).status_code == 201
    t = signup(api, "waster@example.com")
    db, now = Database(db_url), datetime.now(UTC)
    api_clock(now)  # capacity is counted to the API's now: 24 GPU-hours exactly, however slow the machine
    with db.write() as s, s.begin():
        s.execute(update(Node).values(created_at=now - timedelta(hours=3)))
    _charge(db, t.org_id, t.user_id, "w1", "RTX-4090", "1", now)  # 8 GPUs held from now-2h to now-1h
    r = api.get("/api/v1/admin/waste", params={"hours": 5}, headers=admin)
    assert r.status_code == 200, r.text
    hours = r.json()
    assert len(hours) == 5 and hours[-1]["hour"] <= now.isoformat()
    cap = sum(h["capacity_gpu_hours"] for h in hours)
    held = sum(h["held_gpu_hours"] for h in hours)
    assert abs(cap - 24) < 0.01 and abs(held - 8) < 0.01
    assert abs(sum(h["idle_gpu_hours"] for h in hours) - 16) < 0.01
    assert hours[0]["idle_fraction"] is None or hours[0]["capacity_gpu_hours"] < 8.01


def test_reports_are_for_operators_and_bounded(api: Any) -> None:
    t = signup(api, "nosy@example.com")
    for path in ("/api/v1/admin/revenue", "/api/v1/admin/waste"):
        assert api.get(path, headers=t.headers).status_code == 403
    admin = bearer(admin_token(api))
    for path, q in (("/api/v1/admin/revenue", {"days": 0}), ("/api/v1/admin/revenue", {"days": 10_000}),
                    ("/api/v1/admin/waste", {"hours": 100_000}), ("/api/v1/admin/waste", {"hours": "x"})):  # fmt: skip
        r = api.get(path, params=q, headers=admin)
        assert r.status_code == 422 and ("days" in r.text or "hours" in r.text), (path, q, r.text)
