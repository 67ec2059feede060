"""The wallet page in-process on SQLite and PostgreSQL: the balance, the statement (filters, pages, CSV with the
formula guard), plans, redeeming a top-up code; another org's money never shown; bad input at the field."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from suanli.web.pages import wallet
from tests.control_plane import admin_token, bearer, join, signup
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

EN = {"Accept-Language": "en"}


def _tenant(api: Any, email: str) -> tuple[Console, Any]:
    """A console signed in as a new user, and that user's API identity (the console's own token)."""
    c = Console(api)
    c.signup(email)
    me = api.get("/api/v1/me", headers=bearer(api.cookies.get("suanli_session"))).json()
    return c, me


def _move(api: Any, org: str, amount: str, memo: str = "", kind: str = "topup") -> None:
    r = api.post(f"/api/v1/admin/orgs/{org}/transactions", json={"amount": amount, "kind": kind, "memo": memo},
                 headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 201, r.text


def _codes(api: Any, amount: str = "25.00", count: int = 1) -> list[str]:
    r = api.post("/api/v1/admin/topup-codes", json={"amount": amount, "count": count, "note": "web test"},
                 headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 201, r.text
    return [c["code"] for c in r.json()["codes"]]


def test_the_wallet_shows_balance_statement_and_plans(api: Any) -> None:
    c, me = _tenant(api, "wallet@example.com")
    org = me["user"]["personal_org_id"]
    _move(api, org, "5", "cash at the desk")
    html = c.get("/wallet", headers=EN).text
    assert 'id="balance">¥15.00<' in html
    assert "trial_credit" in html and "cash at the desk" in html and "¥5.00" in html
    assert "No plans bought." in html
    assert c.get("/wallet", headers={"Accept-Language": "zh-CN"}).text.count("账单明细") == 1


def test_filters_by_kind_and_days_and_pages_forward(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c, me = _tenant(api, "filters@example.com")
    org = me["user"]["personal_org_id"]
    for i in range(3):
        _move(api, org, "1", f"top-up number {i}")
    html = c.get("/wallet?kind=topup", headers=EN).text
    assert "top-up number 2" in html and "trial credit" not in html
    assert "No transactions match." in c.get("/wallet?since=2999-01-01", headers=EN).text
    assert "No transactions match." in c.get("/wallet?until=2000-01-01", headers=EN).text
    assert "top-up number 0" in c.get("/wallet?since=2000-01-01&until=2999-12-31").text
    monkeypatch.setattr(wallet, "PAGE_ROWS", 2)
    first = c.get("/wallet?kind=topup").text
    assert "top-up number 0" in first and "top-up number 1" in first and "top-up number 2" not in first
    nxt = first.split('id="next" href="')[1].split('"')[0].replace("&amp;", "&")
    second = c.get(nxt).text
    assert "top-up number 2" in second and "top-up number 0" not in second and 'id="next"' not in second


def test_csv_export_streams_every_row_and_guards_formulas(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c, me = _tenant(api, "csv@example.com")
    org = me["user"]["personal_org_id"]
    _move(api, org, "2", '=HYPERLINK("http://evil.example","x")')
    monkeypatch.setattr(wallet, "CSV_PAGE", 1)  # one row per API page: the export follows X-Next-After-Id
    r = c.get("/wallet/statement.csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert "attachment" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [x["kind"] for x in rows] == ["trial_credit", "topup"] and r.text.count("id,created_at") == 1
    assert rows[1]["memo"].startswith("'=HYPERLINK") and rows[1]["balance"] == "12.00000000"
    only = list(csv.DictReader(io.StringIO(c.get("/wallet/statement.csv?kind=topup").text)))
    assert [x["kind"] for x in only] == ["topup"] and only[0]["memo"].startswith("'=")
    assert list(csv.DictReader(io.StringIO(c.get("/wallet/statement.csv?until=2000-01-01").text))) == []


@pytest.mark.parametrize(
    ("query", "field"),
    [("since=yesterday", "since"), ("until=2026-13-40", "until"), ("kind=DROP%20TABLE", "kind"),
     ("after=-1", "after"), ("since=2026-02-01&until=2026-01-01", "until"), ("after=" + "9" * 30, "after")],
)  # fmt: skip
def test_bad_filters_are_shown_at_the_field_never_a_500(api: Any, query: str, field: str) -> None:
    c, _ = _tenant(api, f"bad-{field}@example.com")
    r = c.get("/wallet?" + query, headers=EN)
    assert r.status_code == 422 and 'class="field-error"' in r.text and 'id="balance"' in r.text
    assert c.get("/wallet/statement.csv?" + query).status_code == 422


def test_another_orgs_money_is_never_shown(api: Any) -> None:
    _, vme = _tenant(api, "victim@example.com")
    _move(api, vme["user"]["personal_org_id"], "500", "victim's secret top-up")
    c, _ = _tenant(api, "thief@example.com")
    api.cookies.set("suanli_org", vme["user"]["personal_org_id"])  # the switch's cookie naming someone else's org
    html = c.get("/wallet").text
    assert "victim's secret" not in html and "¥510.00" not in html and "¥10.00" in html
    assert "victim's secret" not in c.get("/wallet/statement.csv").text


def test_redeem_a_code_grows_the_balance_once(api: Any) -> None:
    c, _ = _tenant(api, "redeem@example.com")
    code = _codes(api)[0]
    r = c.post("/wallet/redeem", {"code": code}, csrf_from="/wallet", headers=EN)
    assert r.status_code == 200 and 'id="redeemed"' in r.text and "¥25.00 added" in r.text
    assert 'id="balance">¥35.00<' in r.text and "top-up code" in r.text
    again = c.post("/wallet/redeem", {"code": code}, csrf_from="/wallet", headers=EN)
    assert again.status_code == 409 and 'id="code-error"' in again.text and 'id="balance">¥35.00<' in again.text
    bogus = c.post("/wallet/redeem", {"code": "NOT-A-CODE"}, csrf_from="/wallet")
    assert bogus.status_code == 404 and 'id="code-error"' in bogus.text
    empty = c.post("/wallet/redeem", {"code": ""}, csrf_from="/wallet")
    assert empty.status_code == 422 and 'id="code-error"' in empty.text


def test_redeem_without_csrf_is_refused_and_a_viewer_sees_the_apis_refusal(api: Any) -> None:
    c, _ = _tenant(api, "csrf-redeem@example.com")
    code = _codes(api)[0]
    assert c.c.post("/wallet/redeem", data={"code": code}, follow_redirects=False).status_code == 403
    assert 'id="balance">¥10.00<' in c.get("/wallet").text  # nothing was redeemed
    owner = signup(api, "team-owner@example.com")
    team = api.post("/api/v1/orgs", json={"name": "team-redeem"}, headers=owner.headers).json()["id"]
    viewer = signup(api, "viewer@example.com", "viewer-password")
    join(api, owner, team, viewer, role="viewer")
    v = Console(type(api)(api.app))
    v.login("viewer@example.com", "viewer-password")
    v.c.cookies.set("suanli_org", team)
    r = v.post("/wallet/redeem", {"code": code}, csrf_from="/wallet")
    assert r.status_code == 403 and 'id="code-error"' in r.text
    assert r.text.count("¥0.00") >= 1  # the team's balance did not grow
