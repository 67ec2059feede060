"""The payment webhook under attack: forged, replayed, stale and re-sent events, unknown orgs, impossible amounts.
The fake provider is the shipped generic one ("hmac"), behind the same interface a real provider's adapter
implements. In-process on both databases."""

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
from tests.control_plane import Tenant, admin_token, bearer, settings, signup

API = "/api/v1"
HOOK = f"{API}/payments/hmac/webhook"
SECRET = "whsec_" + "k" * 40


@pytest.fixture
def pay(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    from suanli.api.app import create_app

    with TestClient(create_app(settings(tmp_path / "home", db_url, payment_hmac_secret=SECRET))) as client:
        yield client


def _event(org: str, amount: Any = "100.00", event_id: str = "evt_1", **extra: Any) -> bytes:
    return json.dumps({"id": event_id, "org": org, "amount": amount, "currency": "CNY", **extra}).encode()


def _post(api: TestClient, body: bytes, *, secret: str = SECRET, at: int | None = None) -> Any:
    header = sign(secret, body, int(time.time()) if at is None else at)
    return api.post(HOOK, content=body, headers={HEADER: header, "Content-Type": "application/json"})


def _balance(api: TestClient, who: Tenant) -> Decimal:
    return Decimal(api.get(f"{API}/orgs/{who.org_id}/balance", headers=who.headers).json()["exact"])


def test_a_signed_event_credits_once_and_its_replay_credits_nothing(pay: TestClient) -> None:
    who = signup(pay, "payer@example.com")
    before = _balance(pay, who)
    body = _event(who.org_id, "100.01")
    r = _post(pay, body)
    assert r.status_code == 200 and r.json()["duplicate"] is False, r.text
    assert _balance(pay, who) - before == Decimal("100.01")
    for _ in range(2):  # the provider retries; an attacker replays a captured request within the tolerance
        r = _post(pay, body)
        assert r.status_code == 200 and r.json()["duplicate"] is True, r.text
    assert _balance(pay, who) - before == Decimal("100.01")
    rows = pay.get(f"{API}/orgs/{who.org_id}/statement", headers=who.headers).json()["rows"]
    top = [row for row in rows if row["kind"] == "topup"]
    assert [t["amount"] for t in top] == ["100.01000000"] and "hmac" in top[0]["memo"] and "evt_1" in top[0]["memo"]
    r = _post(pay, _event(who.org_id, "999.00"))  # the same event id, another amount: not the same payment
    assert r.status_code == 409, r.text
    assert _balance(pay, who) - before == Decimal("100.01")
    check = pay.get(f"{API}/admin/ledger/check", headers=bearer(admin_token(pay))).json()
    assert check["ok"], check


def test_forged_missing_stale_and_future_signatures_are_refused(pay: TestClient) -> None:
    who = signup(pay, "payer@example.com")
    before = _balance(pay, who)
    body = _event(who.org_id)
    now = int(time.time())
    assert _post(pay, body, secret="whsec_" + "x" * 40).status_code == 401
    assert pay.post(HOOK, content=body, headers={"Content-Type": "application/json"}).status_code == 401
    for header in ("garbage", "t=abc,v1=00", f"t={now}", f"t={now},v1=" + "0" * 64, f"v1={'0' * 64}"):
        r = pay.post(HOOK, content=body, headers={HEADER: header})
        assert r.status_code == 401, (header, r.text)
    good = sign(SECRET, body, now)
    tampered = body.replace(b"100.00", b"900.00")
    assert pay.post(HOOK, content=tampered, headers={HEADER: good}).status_code == 401
    r = _post(pay, body, at=now - 3600)
    assert r.status_code == 401 and "timestamp" in r.json()["detail"], r.text
    assert _post(pay, body, at=now + 3600).status_code == 401
    assert _balance(pay, who) == before


@pytest.mark.parametrize(
    ("amount", "field"),
    [("0", "amount"), ("-5", "amount"), ("1000000.01", "amount"), (1.5, "amount"), ("0.001", "amount"),
     ("1e3", "amount"), ("Infinity", "amount"), (None, "amount")],
)  # fmt: skip
def test_impossible_amounts_are_refused(pay: TestClient, amount: Any, field: str) -> None:
    who = signup(pay, "payer@example.com")
    before = _balance(pay, who)
    r = _post(pay, _event(who.org_id, amount))
    assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert _balance(pay, who) == before


def test_unknown_orgs_currencies_and_providers_are_refused(pay: TestClient) -> None:
    who = signup(pay, "payer@example.com")
    r = _post(pay, _event("org_ffffffffffffffff"))
    assert r.status_code == 404 and "org" in r.json()["detail"], r.text
    r = _post(pay, _event(who.email))  # an org's name is not accepted: only its id names it unambiguously
    assert r.status_code == 422 and "org" in r.json()["detail"], r.text
    r = _post(pay, _event(who.org_id, currency="USD"))
    assert r.status_code == 422 and "currency" in r.json()["detail"], r.text
    r = _post(pay, b"not json")
    assert r.status_code == 422, r.text
    body = _event(who.org_id)
    r = pay.post(f"{API}/payments/stripe/webhook", content=body, headers={HEADER: sign(SECRET, body, int(time.time()))})
    assert r.status_code == 404, r.text
    assert _balance(pay, who) == Decimal("10")


def test_no_secret_configured_means_no_webhook(api: TestClient) -> None:
    body = _event("org_ffffffffffffffff")
    r = api.post(HOOK, content=body, headers={HEADER: sign(SECRET, body, int(time.time()))})
    assert r.status_code == 404, r.text


def test_the_secret_is_never_shown(pay: TestClient) -> None:
    who = signup(pay, "payer@example.com")
    for path in ("/openapi.json", f"{API}/me", f"{API}/prices", "/healthz"):
        assert SECRET not in pay.get(path, headers=who.headers).text
    assert SECRET not in repr(pay.app.state.server.settings)  # type: ignore[attr-defined]
