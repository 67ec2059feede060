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
