"""Money under concurrent requests, on a real server (two worker processes) over HTTP, on both databases: 200
requests at once — plan purchases (many with one idempotency key), operator top-ups with one key, and job
submissions — must all succeed, post each key once, and leave every balance equal to its entries."""

from __future__ import annotations

import asyncio
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from suanli.control.money import ledger
from suanli.db.engine import Database
from suanli.db.models import LedgerTransaction, Plan
from tests.control_plane import admin_token, bearer, live_server, signup

SAME_KEY_PLANS = 60
OWN_KEY_PLANS = 20
SAME_KEY_TOPUPS = 60
SUBMISSIONS = 60
TOPUP = "1234.56789012"


async def _fire(url: str, requests: list[tuple[str, str, dict[str, str], dict[str, Any]]]) -> list[httpx.Response]:
    """Send every request at once (one connection each), so same-key requests really race."""
    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        return list(await asyncio.gather(*(c.request(m, p, headers=h, json=b) for m, p, h, b in requests)))


def test_concurrent_purchases_top_ups_and_submissions_post_each_key_once(db_url: str, tmp_path: Path) -> None:
    args = ("--workers", "2", "--virtual", "h20-roce800-128")
    with live_server(tmp_path / "home", db_url, args=args) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        admin = bearer(admin_token(c))
        t = signup(c, "buyer@example.com")
        r = c.post(f"/api/v1/admin/orgs/{t.org_id}/transactions", headers=admin, json={"amount": "100000"})
        assert r.status_code == 201, r.text
        start = Decimal(c.get(f"/api/v1/orgs/{t.org_id}/balance", headers=t.headers).json()["exact"])
        plans, topups = f"/api/v1/orgs/{t.org_id}/plans", f"/api/v1/admin/orgs/{t.org_id}/transactions"
        same = {"plan": "hourly", "gpu": "H20", "gpus": 1, "key": "one-purchase"}
        spec = {"command": "train", "duration": 3600, "resources": {"gpu": "H20", "gpus": 1}}
        requests = (
            [("POST", plans, t.headers, same)] * SAME_KEY_PLANS
            + [("POST", plans, t.headers, {**same, "key": f"own-{i}"}) for i in range(OWN_KEY_PLANS)]
            + [("POST", topups, admin, {"amount": TOPUP, "key": "one-topup"})] * SAME_KEY_TOPUPS
            + [("POST", "/api/v1/workloads", t.headers, {"spec": {**spec, "name": f"j{i}"}})
               for i in range(SUBMISSIONS)]
        )  # fmt: skip
        answers = asyncio.run(_fire(srv.url, requests))

        statuses = Counter(r.status_code for r in answers)
        refused = [(r.status_code, r.text[:200]) for r in answers if r.status_code != 201]
        assert statuses == {201: len(requests)}, refused
        same_plans = {r.json()["id"] for r in answers[:SAME_KEY_PLANS]}
        assert len(same_plans) == 1, same_plans  # every retry of the purchase answers the first one's plan
        own = {r.json()["id"] for r in answers[SAME_KEY_PLANS : SAME_KEY_PLANS + OWN_KEY_PLANS]}
        assert len(own) == OWN_KEY_PLANS and not own & same_plans
        first = SAME_KEY_PLANS + OWN_KEY_PLANS
        assert len({r.json()["id"] for r in answers[first : first + SAME_KEY_TOPUPS]}) == 1

        listed = c.get(plans, headers=t.headers).json()
        assert len(listed) == 1 + OWN_KEY_PLANS
        price = Decimal(listed[0]["price"])
        check = c.get("/api/v1/admin/ledger/check", headers=admin).json()
        assert check["ok"], check
    db = Database(db_url)  # the server is gone: nothing is charged between the reads
    try:
        with db.read() as s:
            keys = Counter(s.scalars(select(LedgerTransaction.key).where(LedgerTransaction.org_id == t.org_id)))
            assert keys[f"plan:{t.org_id}:one-purchase"] == 1 and keys[f"topup:{t.org_id}:one-topup"] == 1
            assert s.scalar(select(func.count()).select_from(Plan)) == 1 + OWN_KEY_PLANS
            usage = -sum((ledger.net_for_org(x, t.org_id) for x in ledger.transactions(s, t.org_id, limit=10_000)
                          if x.kind == "usage"), Decimal(0))  # fmt: skip
            paid = start + Decimal(TOPUP) - (1 + OWN_KEY_PLANS) * price - usage
            assert ledger.org_balance(s, t.org_id) == paid
            assert ledger.recompute(s) == {}
    finally:
        db.dispose()
    assert "Traceback" not in srv.log.read_text(errors="replace")
