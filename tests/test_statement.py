"""`suanli statement`, GET /orgs/{id}/statement and `Client.statement`: every transaction of an org, oldest first,
with its memo, the workload it paid for and the balance after it; pages bounded, CSV exact; members only.
In-process on both databases (the SDK and the CLI through a transport into the app)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import suanli.client
from suanli.billing.metering import cost_of
from suanli.client import Client, Statement
from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.control.money.statement import FIELDS
from suanli.db.models import Membership
from tests.cli_helpers import invoke
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"


class World:
    def __init__(self, api: TestClient) -> None:
        self.api = api
        self.admin = bearer(admin_token(api))
        r = api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=self.admin)
        assert r.status_code == 201, r.text
        self.tenant = signup(api, "payer@example.com")
        self.org = self.tenant.org_id

    def move(self, kind: str, amount: str, memo: str) -> None:
        r = self.api.post(f"{API}/admin/orgs/{self.org}/transactions", headers=self.admin,
                          json={"kind": kind, "amount": amount, "memo": memo})  # fmt: skip
        assert r.status_code == 201, r.text

    def statement(self, who: Tenant | None = None, status: int = 200, **params: Any) -> Any:
        r = self.api.get(f"{API}/orgs/{self.org}/statement", params=params, headers=(who or self.tenant).headers)
        assert r.status_code == status, r.text
        return r.json() if params.get("format") != "csv" else r


@pytest.fixture
def world(api: TestClient) -> World:
    """Trial credit, a top-up, a plan, a workload's usage windows (charged past its end, then given back) and a
    refund, in that order."""
    w = World(api)
    w.move("topup", "1000", "wire 42")
    r = api.post(
        f"{API}/orgs/{w.org}/plans", json={"plan": "hourly", "gpu": "H20", "gpus": 1}, headers=w.tenant.headers
    )
    assert r.status_code == 201, r.text
    r = api.post(f"{API}/workloads", headers=w.tenant.headers,
                 json={"spec": {"name": "train", "command": "x", "resources": {"gpus": 0}}})  # fmt: skip
    assert r.status_code == 201, r.text
    w.workload = r.json()["id"]
    db = api.app.state.server.db
    t0 = utcnow()
    with db.write() as s, s.begin():
        a = metering.open_allocation(s, org_id=w.org, user_id=w.tenant.user_id, workload=w.workload, gpu_model=None,
                                     gpus=0, placement={}, now=t0, hold_minutes=0)  # fmt: skip
        a.rate_per_hour = Decimal("0.36")
        w.alloc = a.id
    metering.meter(db, "w", t0 + timedelta(seconds=130), window_s=60)
    metering.meter(db, "w", t0 + timedelta(seconds=200), window_s=60)
    with db.write() as s, s.begin():
        metering.close_allocation(s, w.alloc, t0 + timedelta(seconds=150.4))
    metering.meter(db, "w", t0 + timedelta(seconds=210), window_s=60)
    w.move("refund", "1.5", "sorry for the outage")
    return w


def test_every_transaction_in_order_with_its_memo_workload_and_running_balance(world: World) -> None:
    st = world.statement()
    rows = st["rows"]
    assert [r["kind"] for r in rows] == ["trial_credit", "topup", "plan_purchase", "usage", "usage", "usage",
                                         "refund", "refund"]  # fmt: skip
    assert st["opening_balance"] == "0.00000000" and st["next_after_id"] is None and st["currency"] == "CNY"
    balance = Decimal(0)
    for r in rows:  # each balance is the one before plus its amount, exactly
        balance += Decimal(r["amount"])
        assert Decimal(r["balance"]) == balance
    exact = world.api.get(f"{API}/orgs/{world.org}/balance", headers=world.tenant.headers).json()["exact"]
    assert st["closing_balance"] == rows[-1]["balance"] == exact
    trial, topup, plan, *usage, given_back, refund = rows
    assert (trial["amount"], topup["amount"], topup["memo"]) == ("10.00000000", "1000.00000000", "wire 42")
    assert plan["memo"] == "hourly plan: 1 x H20" and Decimal(plan["amount"]) < 0
    rate = Decimal("0.36")
    assert [Decimal(u["amount"]) for u in usage] == [-cost_of(rate, 60)] * 3
    assert [u["memo"] for u in usage] == [f"{world.workload}: 0-60 s", f"{world.workload}: 60-120 s",
                                          f"{world.workload}: 120-180 s"]  # fmt: skip
    assert given_back["key"] == f"usage-credit:{world.alloc}:150" and "30 s given back" in given_back["memo"]
    assert Decimal(given_back["amount"]) == cost_of(rate, 30)  # net: 150 s of a 150.4 s run
    for r in (*usage, given_back):
        assert (r["workload"], r["workload_name"], r["allocation"]) == (world.workload, "train", world.alloc)
    assert (refund["memo"], refund["amount"], refund["workload"]) == ("sorry for the outage", "1.50000000", None)


def test_pages_are_bounded_and_add_up_to_the_whole(world: World) -> None:
    whole = world.statement()["rows"]
    got, after, opening = [], None, "0.00000000"
    while True:
        page = world.statement(limit=3, **({"after_id": after} if after is not None else {}))
        assert len(page["rows"]) <= 3 and page["opening_balance"] == opening
        got += page["rows"]
        opening = page["closing_balance"]
        after = page["next_after_id"]
        if after is None:
            break
    assert got == whole
    since = world.statement(since=whole[2]["created_at"])  # from the plan purchase on
    assert since["rows"] == whole[2:] and since["opening_balance"] == whole[1]["balance"]
    empty = world.statement(after_id=whole[-1]["id"])
    assert empty["rows"] == [] and empty["opening_balance"] == empty["closing_balance"] == whole[-1]["balance"]
    for params, field in (({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"after_id": -1}, "after_id"),
                          ({"since": "yesterday"}, "since"), ({"format": "xml"}, "format")):  # fmt: skip
        assert field in world.statement(status=422, **params)["detail"]


def test_csv_is_exact_and_the_same_rows(world: World) -> None:
    whole = world.statement()["rows"]
    r = world.statement(format="csv", limit=5)
    assert r.headers["content-type"].startswith("text/csv") and r.headers["x-next-after-id"] == str(whole[4]["id"])
    parsed = list(csv.DictReader(io.StringIO(r.text)))
    assert tuple(parsed[0]) == FIELDS
    assert [(p["kind"], p["amount"], p["balance"], p["memo"]) for p in parsed] == [
        (w["kind"], w["amount"], w["balance"], w["memo"]) for w in whole[:5]]  # fmt: skip
    assert parsed[3]["amount"] == "-0.00600000" and parsed[3]["workload_name"] == "train"
    last = world.statement(format="csv", after_id=whole[4]["id"])
    assert "x-next-after-id" not in last.headers


def test_a_tenant_reads_only_its_orgs_statements(world: World) -> None:
    api = world.api
    mallory = signup(api, "mallory@example.com")
    for org in (world.org, "org_0000000000000000"):
        r = api.get(f"{API}/orgs/{org}/statement", headers=mallory.headers)
        assert r.status_code == 404 and world.tenant.email not in r.text
        r = api.get(f"{API}/orgs/{org}/statement", params={"format": "csv"}, headers=mallory.headers)
        assert r.status_code == 404
    assert api.get(f"{API}/orgs/{world.org}/statement").status_code == 401
    team = api.post(f"{API}/orgs", json={"name": "payer-team"}, headers=world.tenant.headers).json()["id"]
    with api.app.state.server.db.write() as s, s.begin():
        s.add(Membership(org_id=team, user_id=mallory.user_id, role="member"))
    api.post(f"{API}/admin/orgs/{team}/transactions", json={"amount": "5", "memo": "team money"},
             headers=world.admin).raise_for_status()  # fmt: skip
    r = api.get(f"{API}/orgs/{team}/statement", headers=mallory.headers)  # a member of the team reads the team's
    assert r.status_code == 200 and [x["memo"] for x in r.json()["rows"]] == ["team money"]
    assert world.statement(who=Tenant("ops", world.admin["Authorization"][7:], "", ""))["rows"]  # operators too


def forwarding(api: TestClient) -> httpx.MockTransport:
    """An httpx transport into the in-process app, response headers and all."""

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        r = api.request(request.method, request.url.path, params=request.url.params, headers=headers)
        keep = {k: v for k, v in r.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return httpx.Response(r.status_code, headers=keep, content=r.content)

    return httpx.MockTransport(handle)


@pytest.fixture
def sdk(world: World, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[World]:
    transport = forwarding(world.api)

    class Forwarded(Client):
        def __init__(self, server: str | None = None, token: str | None = None, **kw: Any) -> None:
            super().__init__(server, token, transport=transport)

    monkeypatch.setattr(suanli.client, "Client", Forwarded)
    monkeypatch.setenv("SUANLI_HOME", str(tmp_path / "cli-home"))
    monkeypatch.setenv("SUANLI_SERVER", "http://suanli.test")
    monkeypatch.setenv("SUANLI_TOKEN", world.tenant.token)
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr("suanli.client.money.PAGE", 3)  # several pages from a short history
    yield world


def test_the_sdk_and_the_cli_read_the_same_statement(sdk: World) -> None:
    whole = sdk.statement()
    c = suanli.client.Client("http://suanli.test", sdk.tenant.token)
    page = c.statement(limit=2)
    assert isinstance(page, Statement) and len(page.rows) == 2 and page.next_after_id == page.rows[-1].id
    assert page.rows[1].balance == Decimal("1010") and page.opening_balance == 0
    every = c.statement_all()
    assert [r.id for r in every.rows] == [r["id"] for r in whole["rows"]] and every.next_after_id is None
    assert every.closing_balance == Decimal(whole["closing_balance"]) and every.rows[3].workload_name == "train"
    text = c.statement_csv()
    assert text.count("id,created_at,kind") == 1 and len(text.strip().splitlines()) == 1 + len(whole["rows"])
    assert invoke(["statement", "--csv"]).stdout == text
    doc = json.loads(invoke(["statement", "--json"]).stdout)
    assert doc["closing_balance"] == whole["closing_balance"] and len(doc["rows"]) == len(whole["rows"])
    table = invoke(["statement"]).stdout
    assert "wire 42" in table and "train" in table and "30 s given back" in table and "closing balance" in table
    assert "-0.006" in table  # exact amounts, not rounded to cents
    assert invoke(["statement", "--since", "not-a-date"], code=2).stderr.startswith("error: ")
    assert "at most one" in invoke(["statement", "--csv", "--json"], code=2).stderr


def test_the_statement_filters_by_kind_and_until_with_true_balances(api: Any) -> None:
    """`kind` keeps the org's own balance after each row; `until` stops before it; bad values are 422s."""
    t = signup(api, "filters@example.com")
    adm = bearer(admin_token(api))
    for amount in ("1.25", "2.50"):
        r = api.post(f"{API}/admin/orgs/{t.org_id}/transactions", json={"kind": "topup", "amount": amount}, headers=adm)
        assert r.status_code in (200, 201), r.text
    url = f"{API}/orgs/{t.org_id}/statement"
    every = api.get(url, headers=t.headers).json()["rows"]
    tops = api.get(url, params={"kind": "topup"}, headers=t.headers).json()["rows"]
    assert [r["kind"] for r in tops] == ["topup", "topup"]
    assert [r["balance"] for r in tops] == [r["balance"] for r in every if r["kind"] == "topup"]  # not re-summed
    assert [r["balance"] for r in tops] == ["11.25000000", "13.75000000"]
    before = api.get(url, params={"until": every[1]["created_at"]}, headers=t.headers).json()["rows"]
    assert [r["id"] for r in before] == [r["id"] for r in every if r["created_at"] < every[1]["created_at"]]
    assert api.get(url, params={"until": "2000-01-01T00:00:00Z"}, headers=t.headers).json()["rows"] == []
    csv_text = api.get(url, params={"kind": "topup", "format": "csv"}, headers=t.headers).text
    assert [r["kind"] for r in csv.DictReader(io.StringIO(csv_text))] == ["topup", "topup"]
    stranger = signup(api, "stranger@example.com")  # a foreign tenant's filters open nothing
    r = api.get(url, params={"kind": "topup", "until": "2100-01-01T00:00:00Z"}, headers=stranger.headers)
    assert r.status_code == 404 and "13.75" not in r.text
    for bad in ({"kind": "TOPUP"}, {"kind": "x" * 33}, {"kind": "a=b"}, {"until": "not-a-time"}):
        r = api.get(url, params=bad, headers=t.headers)
        assert r.status_code == 422 and r.json()["detail"].startswith(("query.kind", "query.until")), (bad, r.text)
