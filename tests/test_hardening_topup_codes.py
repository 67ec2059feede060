"""Top-up codes under attack: a tenant calling the operators' routes, guessing codes, spending one twice, redeeming
into an org that is not theirs or that the code is not for, and operators typing impossible amounts. Attacks first;
in-process on both databases (the concurrent double spend against a live server is in test_topup_codes_live.py)."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.control.accounts.accounts import Principal
from suanli.control.ids import utcnow
from suanli.control.money import topup_codes
from suanli.db.credit import TopupCode
from tests.control_plane import Tenant, admin_token, bearer, join, signup

API = "/api/v1"
CODES = f"{API}/admin/topup-codes"


def _create(api: TestClient, adm: dict[str, str], **body: Any) -> Any:
    r = api.post(CODES, json={"amount": "12.34", "count": 3, "note": "campus card", **body}, headers=adm)
    assert r.status_code == 201, r.text
    return r.json()


def _redeem(api: TestClient, who: Tenant, code: str, org: str | None = None) -> Any:
    return api.post(f"{API}/orgs/{org or who.org_id}/redeem", json={"code": code}, headers=who.headers)


def _balance(api: TestClient, who: Tenant, org: str | None = None) -> Decimal:
    r = api.get(f"{API}/orgs/{org or who.org_id}/balance", headers=who.headers)
    assert r.status_code == 200, r.text
    return Decimal(r.json()["exact"])


def test_a_tenant_calling_the_operators_code_routes_gets_403(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    batch = _create(api, adm)["batch"]["id"]
    mallory = signup(api, "mallory@example.com")
    h = mallory.headers
    for method, path, body in (("POST", CODES, {"amount": "100", "count": 1}), ("GET", CODES, None),
                               ("GET", f"{CODES}/{batch}", None), ("POST", f"{CODES}/{batch}/void", {})):  # fmt: skip
        r = api.request(method, path, json=body, headers=h)
        assert r.status_code == 403, (method, path, r.text)
    assert api.get(f"{CODES}/{batch}", headers=adm).json()["voided"] == 0


def test_codes_are_shown_once_stored_hashed_and_never_listed_again(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    made = _create(api, adm)
    plain = [c["code"] for c in made["codes"]]
    assert len(set(plain)) == 3 and all(len(p.replace("-", "")) == 20 for p in plain)
    listing = api.get(f"{CODES}/{made['batch']['id']}", headers=adm).text + api.get(CODES, headers=adm).text
    for p in plain:
        assert p not in listing and p.replace("-", "") not in listing
    with api.app.state.server.db.read() as s:  # type: ignore[attr-defined]
        stored = {c.code_hash for c in s.scalars(select(TopupCode))}
    assert stored == {hashlib.sha256(p.replace("-", "").encode()).hexdigest() for p in plain}


def test_a_code_credits_exactly_once_and_shows_in_the_statement(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    made = _create(api, adm)
    code, code_id = made["codes"][0]["code"], made["codes"][0]["id"]
    who = signup(api, "tenant@example.com")
    before = _balance(api, who)
    r = _redeem(api, who, code.lower().replace("-", " "))  # typed by hand: case and separators do not matter
    assert r.status_code == 200, r.text
    assert r.json()["amount"] == "12.34000000" and r.json()["code_id"] == code_id
    assert _balance(api, who) - before == Decimal("12.34")
    r = _redeem(api, who, code)
    assert r.status_code == 409 and r.json()["detail"].startswith("code"), r.text
    assert _balance(api, who) - before == Decimal("12.34")
    rows = api.get(f"{API}/orgs/{who.org_id}/statement", headers=who.headers).json()["rows"]
    top = [row for row in rows if row["kind"] == "topup"]
    assert len(top) == 1 and top[0]["amount"] == "12.34000000"
    assert code_id in top[0]["memo"] and "campus card" in top[0]["memo"] and code not in top[0]["memo"]
    codes = api.get(f"{CODES}/{made['batch']['id']}", headers=adm).json()["codes"]
    used = next(c for c in codes if c["id"] == code_id)
    assert used["state"] == "redeemed" and used["redeemed_by"] == who.email and used["redeemed_org"] == who.org_id
    assert api.get(CODES, headers=adm).json()[0]["redeemed"] == 1


def test_unknown_voided_and_expired_codes_are_refused_and_credit_nothing(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    made = _create(api, adm)
    who = signup(api, "tenant@example.com")
    before = _balance(api, who)
    r = _redeem(api, who, "ABCDE-FGHJK-MNPQR-STVWX")
    assert r.status_code == 404 and r.json()["detail"].startswith("code"), r.text
    assert _redeem(api, who, "not a code at all!").status_code == 404
    r = api.post(f"{CODES}/{made['batch']['id']}/void", json={"codes": [made["codes"][0]["id"]]}, headers=adm)
    assert r.status_code == 200 and r.json()["voided"] == 1, r.text
    r = _redeem(api, who, made["codes"][0]["code"])
    assert r.status_code == 410 and "voided" in r.json()["detail"], r.text
    db = api.app.state.server.db  # type: ignore[attr-defined]
    long_ago = utcnow() - timedelta(days=3)
    with db.write() as s, s.begin():
        op = Principal(admin_user(api, adm), "ops", True, "", "t")
        _, old = topup_codes.create_batch(s, op, Decimal("5"), 1, long_ago, expires_at=long_ago + timedelta(days=1))
    r = _redeem(api, who, old[0][1])
    assert r.status_code == 410 and "expired" in r.json()["detail"], r.text
    assert _balance(api, who) == before
    assert _redeem(api, who, made["codes"][1]["code"]).status_code == 200  # the rest of the batch still works


def admin_user(api: TestClient, adm: dict[str, str]) -> str:
    return str(api.get(f"{API}/me", headers=adm).json()["user"]["id"])


def test_guessing_codes_is_throttled_per_user_and_a_success_is_not_counted(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    made = _create(api, adm, count=5)
    good = [c["code"] for c in made["codes"]]
    who = signup(api, "guesser@example.com")
    for code in good[:3]:  # redeeming many real codes in a row is not guessing
        assert _redeem(api, who, code).status_code == 200
    for i in range(topup_codes.REDEEM_USER.capacity):
        assert _redeem(api, who, f"AAAAA-AAAAA-AAAAA-{i:05d}").status_code == 404
    r = _redeem(api, who, good[3])
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
    assert _balance(api, who) == Decimal("10") + 3 * Decimal("12.34")
    other = signup(api, "honest@example.com")  # the same address, another user: under the address's limit
    assert _redeem(api, other, good[3]).status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [("amount", "-5"), ("amount", "0"), ("amount", "1000000.01"), ("amount", 1.5), ("amount", "0.001"),
     ("amount", "NaN"), ("count", 0), ("count", topup_codes.MAX_COUNT + 1), ("expires_at", "2001-01-01T00:00:00Z"),
     ("note", "x" * 201), ("org", "org_ffffffffffffffff")],
)  # fmt: skip
def test_impossible_batches_are_refused_naming_the_field(api: TestClient, field: str, value: Any) -> None:
    adm = bearer(admin_token(api))
    r = api.post(CODES, json={"amount": "10", "count": 2, field: value}, headers=adm)
    assert r.status_code in (404, 422) and field in r.json()["detail"], r.text
    assert api.get(CODES, headers=adm).json() == []


def test_a_code_for_another_org_or_into_an_org_that_is_not_yours_credits_nothing(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    alice, mallory = signup(api, "alice@example.com"), signup(api, "mallory@example.com")
    made = _create(api, adm, org=alice.org_id, count=1)
    code = made["codes"][0]["code"]
    r = _redeem(api, mallory, code)  # a code sold to alice's org, into mallory's own org
    assert r.status_code == 403 and "another organisation" in r.json()["detail"], r.text
    r = _redeem(api, mallory, code, org=alice.org_id)  # into alice's org, where mallory is nobody
    assert r.status_code == 404, r.text
    assert _balance(api, mallory) == Decimal("10") and _balance(api, alice) == Decimal("10")
    assert _redeem(api, alice, code).status_code == 200
    assert _balance(api, alice) == Decimal("22.34")


def test_only_members_who_may_spend_redeem_into_a_team(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    owner, member, viewer = (signup(api, f"{n}@example.com") for n in ("owner", "member", "viewer"))
    team = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, team, member, "member")
    join(api, owner, team, viewer, "viewer")
    codes = [c["code"] for c in _create(api, adm, count=2)["codes"]]
    r = _redeem(api, viewer, codes[0], org=team)
    assert r.status_code == 403 and "viewer" in r.json()["detail"], r.text
    assert _redeem(api, member, codes[0], org=team).status_code == 200
    assert _redeem(api, owner, codes[1], org=team).status_code == 200
    assert _balance(api, owner, team) == Decimal("24.68")


def test_voiding_a_batch_voids_only_what_is_unredeemed(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    made = _create(api, adm)
    who = signup(api, "tenant@example.com")
    assert _redeem(api, who, made["codes"][0]["code"]).status_code == 200
    r = api.post(f"{CODES}/{made['batch']['id']}/void", json={}, headers=adm)
    assert r.status_code == 200 and r.json()["voided"] == 2 and r.json()["redeemed"] == 1, r.text
    states = sorted(c["state"] for c in api.get(f"{CODES}/{made['batch']['id']}", headers=adm).json()["codes"])
    assert states == ["redeemed", "voided", "voided"]
    r = api.post(f"{CODES}/{made['batch']['id']}/void", json={"codes": [made["codes"][0]["id"]]}, headers=adm)
    assert r.status_code == 409, r.text  # a redeemed code cannot be voided: the money is the tenant's
    assert api.post(f"{CODES}/batch_ffffffffffffffff/void", json={}, headers=adm).status_code == 404
