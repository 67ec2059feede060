"""Top-up codes and the payment webhook under a reviewer's attacks: hostile signature headers, codes raced against
voiding, redeemed across orgs, and exact amounts. In-process on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.payments.hmac_provider import HEADER, sign
from tests.control_plane import admin_token, bearer, settings, signup

API = "/api/v1"
HOOK = f"{API}/payments/hmac/webhook"
SECRET = "whsec_" + "r" * 40


@pytest.fixture
def pay(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    from suanli.api.app import create_app

    with TestClient(create_app(settings(tmp_path / "home", db_url, payment_hmac_secret=SECRET))) as client:
        yield client


def _balance(api: TestClient, org: str, headers: dict[str, str]) -> Decimal:
    return Decimal(api.get(f"{API}/orgs/{org}/balance", headers=headers).json()["exact"])


@pytest.mark.parametrize(
    "header",
    [
        "t=\u00b2,v1=" + "0" * 64,  # a superscript two: str.isdigit() says yes, int() says no
        "t=\u00b9\u00b2\u00b3,v1=" + "0" * 64,
        "t={now},v1=\u00e9" + "0" * 63,  # a non-ASCII signature: hmac.compare_digest raises on str
        "t={now},v1=\u00ff",
    ],
)
def test_a_hostile_signature_header_is_401_never_a_500(pay: TestClient, header: str) -> None:
    who = signup(pay, "payer@example.com")
    body = json.dumps({"id": "evt_x", "org": who.org_id, "amount": "5.00", "currency": "CNY"}).encode()
    value = header.replace("{now}", str(int(time.time())))
    r = pay.post(HOOK, content=body, headers={HEADER: value.encode("latin-1")})  # type: ignore[dict-item]
    assert r.status_code == 401, r.text
    assert r.json()["detail"].startswith("webhook:")
    assert _balance(pay, who.org_id, who.headers) == Decimal("10")


def test_an_event_signed_for_one_org_cannot_be_replayed_into_another(pay: TestClient) -> None:
    """The same event id names one payment: re-sent with another org (a forged body cannot be signed, but a
    provider's bug or a reused id can) it is a 409 and credits nobody."""
    a, b = signup(pay, "a@example.com"), signup(pay, "b@example.com")
    now = int(time.time())
    first = json.dumps({"id": "evt_1", "org": a.org_id, "amount": "7.00", "currency": "CNY"}).encode()
    assert pay.post(HOOK, content=first, headers={HEADER: sign(SECRET, first, now)}).status_code == 200
    other = json.dumps({"id": "evt_1", "org": b.org_id, "amount": "7.00", "currency": "CNY"}).encode()
    r = pay.post(HOOK, content=other, headers={HEADER: sign(SECRET, other, now)})
    assert r.status_code == 409, r.text
    assert _balance(pay, b.org_id, b.headers) == Decimal("10")
    assert _balance(pay, a.org_id, a.headers) == Decimal("17")


def _codes(api: TestClient, admin: dict[str, str], **body: Any) -> tuple[str, list[str]]:
    r = api.post(f"{API}/admin/topup-codes", json={"amount": "0.01", "count": 2, **body}, headers=admin)
    assert r.status_code == 201, r.text
    return r.json()["batch"]["id"], [c["code"] for c in r.json()["codes"]]


def test_a_code_redeemed_once_cannot_be_redeemed_into_another_org_nor_voided(pay: TestClient) -> None:
    admin = bearer(admin_token(pay))
    a, b = signup(pay, "a@example.com"), signup(pay, "b@example.com")
    batch, (code, spare) = _codes(pay, admin)
    assert pay.post(f"{API}/orgs/{a.org_id}/redeem", json={"code": code}, headers=a.headers).status_code == 200
    r = pay.post(f"{API}/orgs/{b.org_id}/redeem", json={"code": code.lower()}, headers=b.headers)
    assert r.status_code == 409, r.text
    # a tenant cannot redeem into an org it is not a member of, even with a good code (404, as every org route)
    r = pay.post(f"{API}/orgs/{a.org_id}/redeem", json={"code": spare}, headers=b.headers)
    assert r.status_code == 404, r.text
    voided = pay.post(f"{API}/admin/topup-codes/{batch}/void", json={}, headers=admin).json()
    assert voided["redeemed"] == 1 and voided["voided"] == 1
    r = pay.post(f"{API}/orgs/{b.org_id}/redeem", json={"code": spare}, headers=b.headers)
    assert r.status_code == 410, r.text
    # a cent, exactly, on both databases; and the listing never shows a code's text
    assert _balance(pay, a.org_id, a.headers) == Decimal("10.01")
    assert _balance(pay, b.org_id, b.headers) == Decimal("10")
    listing = (
        pay.get(f"{API}/admin/topup-codes/{batch}", headers=admin).text
        + pay.get(f"{API}/admin/topup-codes", headers=admin).text
    )
    for c in (code, spare):
        assert c not in listing and c.replace("-", "") not in listing


def test_voiding_and_redeeming_one_code_at_once_never_does_both(pay: TestClient) -> None:
    """Threads race a void of each code against its redemption: each code ends redeemed (credited once, the void
    refused 409) or voided (the redemption refused 410), never both, and the ledger holds exactly the redeemed."""
    from concurrent.futures import ThreadPoolExecutor

    from suanli.control.accounts import accounts
    from suanli.control.errors import ServiceError
    from suanli.control.ids import utcnow
    from suanli.control.money import topup_codes
    from suanli.db.credit import TopupCode

    admin = bearer(admin_token(pay))
    who = signup(pay, "racer@example.com")
    made = pay.post(f"{API}/admin/topup-codes", json={"amount": "1.25", "count": 8}, headers=admin).json()
    batch = made["batch"]["id"]
    db = pay.app.state.server.db  # type: ignore[attr-defined]
    with db.read() as s:
        tenant = accounts.authenticate(s, who.token, utcnow())

    def redeem(code: str) -> str:
        try:
            topup_codes.redeem_with_throttle(db, tenant, who.org_id, code, "198.51.100.7")
            return "redeemed"
        except ServiceError as e:
            return str(e.status)

    def void(code_id: str) -> str:
        try:
            with db.write() as s, s.begin():
                topup_codes.void(s, batch, utcnow(), [code_id])
            return "voided"
        except ServiceError as e:
            return str(e.status)

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [(pool.submit(redeem, c["code"]), pool.submit(void, c["id"])) for c in made["codes"]]
        outcomes = [(r.result(), v.result()) for r, v in futures]
    assert all(o in (("redeemed", "409"), ("410", "voided")) for o in outcomes), outcomes
    redeemed = sum(1 for r, _ in outcomes if r == "redeemed")
    with db.read() as s:
        rows = s.query(TopupCode).filter(TopupCode.batch_id == batch).all()
        assert not [r.id for r in rows if r.redeemed_at is not None and r.voided_at is not None]
        assert sum(1 for r in rows if r.redeemed_at is not None) == redeemed
    assert _balance(pay, who.org_id, who.headers) == Decimal("10") + Decimal("1.25") * redeemed
