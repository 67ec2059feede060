"""E-mail verification under attack: a link used twice, after it expired, by another logged-in user, 8 redeems of one
link at once, garbage and oversized tokens, resends past the limit, and a mail server that is down at signup. Attacks
first; in-process on both databases, with a real SMTP server (aiosmtpd) receiving the mail and the test clicking the
link it finds there. Without `smtp_url` signup still grants the trial credit at once."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from suanli.api.app import create_app
from suanli.control.accounts import links, verification
from suanli.control.ids import token_hash
from suanli.db.access import EmailVerification
from suanli.db.models import LedgerTransaction
from tests.concurrency import at_once
from tests.control_plane import Tenant, free_port, settings, signup
from tests.mail_helpers import SITE, Inbox, inbox_fixture, mail_api_fixture  # noqa: F401  (the fixtures inbox and mail_api)

API = "/api/v1"


def _app(db_url: str, home: Path, smtp_url: str) -> TestClient:
    return TestClient(create_app(settings(home, db_url, smtp_url=smtp_url, public_url=SITE)))


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2027, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr("suanli.api.routers.auth.utcnow", c)
    return c


def _balance(api: TestClient, who: Tenant) -> Decimal:
    r = api.get(f"{API}/orgs/{who.org_id}/balance", headers=who.headers)
    assert r.status_code == 200, r.text
    return Decimal(r.json()["exact"])


def _verify(api: TestClient, token: Any, headers: dict[str, str] | None = None) -> Any:
    return api.post(f"{API}/verify", json={"token": token}, headers=headers or {})


def _trial_rows(api: TestClient, user_id: str) -> int:
    with api.app.state.server.db.read() as s:  # type: ignore[attr-defined]
        q = select(func.count()).select_from(LedgerTransaction).where(LedgerTransaction.key == f"trial:{user_id}")
        return int(s.scalar(q) or 0)


def _me(api: TestClient, who: Tenant) -> Any:
    r = api.get(f"{API}/me", headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_without_smtp_signup_grants_the_trial_credit_at_once(api: TestClient) -> None:
    r = api.post(f"{API}/signup", json={"email": "plain@example.com", "password": "tenant-password"})
    assert r.status_code == 201, r.text
    assert r.json()["balance"] == "10.00" and r.json()["trial_pending"] is False
    who = Tenant("plain@example.com", r.json()["token"], r.json()["user"]["id"], r.json()["org"]["id"])
    assert _balance(api, who) == Decimal("10.00")
    assert _me(api, who)["trial_pending"] is False and _me(api, who)["email_verified"] is False
    r = api.post(f"{API}/verify/resend", headers=who.headers)
    assert r.status_code == 409 and r.json()["detail"].startswith("email"), r.text


def test_the_mailed_link_releases_the_trial_credit_exactly_once(mail_api: TestClient, inbox: Inbox) -> None:
    r = mail_api.post(f"{API}/signup", json={"email": "New@Example.com", "password": "tenant-password"})
    assert r.status_code == 201, r.text
    assert r.json()["balance"] == "0.00" and r.json()["trial_pending"] is True
    who = Tenant("new@example.com", r.json()["token"], r.json()["user"]["id"], r.json()["org"]["id"])
    assert _balance(mail_api, who) == 0 and _me(mail_api, who)["trial_pending"] is True
    [(rcpt, msg)] = inbox.wait(1)
    assert rcpt == ["new@example.com"] and msg["To"] == "new@example.com"
    body = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert f"{SITE}/verify?token=" in body
    token = inbox.token()
    with mail_api.app.state.server.db.read() as s:  # type: ignore[attr-defined]
        stored = list(s.scalars(select(EmailVerification.token_hash)))
    assert stored == [token_hash(token)]  # only its SHA-256 is kept
    r = _verify(mail_api, token)
    assert r.status_code == 200, r.text
    assert r.json()["credited"] == "10.00" and r.json()["user_id"] == who.user_id and r.json()["email_verified"]
    assert _balance(mail_api, who) == Decimal("10.00") and _trial_rows(mail_api, who.user_id) == 1
    me = _me(mail_api, who)
    assert me["email_verified"] is True and me["trial_pending"] is False
    again = _verify(mail_api, token)
    assert again.status_code == 409 and again.json()["detail"].startswith("token"), again.text
    assert _balance(mail_api, who) == Decimal("10.00") and _trial_rows(mail_api, who.user_id) == 1


def test_a_second_link_after_verifying_is_spent_and_the_credit_stays_once(mail_api: TestClient, inbox: Inbox) -> None:
    who = signup(mail_api, "twice@example.com")
    assert mail_api.post(f"{API}/verify/resend", headers=who.headers).status_code == 202
    inbox.wait(2)
    first, second = inbox.token(0), inbox.token(1)
    assert first != second
    assert _verify(mail_api, second).status_code == 200
    r = _verify(mail_api, first)  # the older link: spent with the address proven
    assert r.status_code == 409 and r.json()["detail"].startswith("token")
    assert mail_api.post(f"{API}/verify/resend", headers=who.headers).status_code == 409  # verified already
    assert _balance(mail_api, who) == Decimal("10.00") and _trial_rows(mail_api, who.user_id) == 1


def test_an_expired_link_is_refused_naming_the_token(mail_api: TestClient, inbox: Inbox, clock: Clock) -> None:
    late, edge = signup(mail_api, "late@example.com"), signup(mail_api, "edge@example.com")
    inbox.wait(2)
    tokens = {rcpt[0]: inbox.token(i) for i, (rcpt, _) in enumerate(inbox.received)}
    clock.now += verification.TOKEN_TTL  # exactly 24 h: expired
    r = _verify(mail_api, tokens["late@example.com"])
    assert r.status_code == 422 and r.json()["detail"].startswith("token") and "expired" in r.json()["detail"]
    assert _balance(mail_api, late) == 0 and _me(mail_api, late)["email_verified"] is False
    clock.now -= timedelta(seconds=1)  # one second before: still good
    r = _verify(mail_api, tokens["edge@example.com"])
    assert r.status_code == 200 and _balance(mail_api, edge) == Decimal("10.00"), r.text


def test_a_link_redeemed_by_another_logged_in_user_credits_its_own_user(mail_api: TestClient, inbox: Inbox) -> None:
    alice = signup(mail_api, "alice@example.com")
    inbox.wait(1)
    mallory = signup(mail_api, "mallory@example.com")
    r = _verify(mail_api, inbox.token(0), headers=mallory.headers)  # a bearer proof of alice's mailbox
    assert r.status_code == 200 and r.json()["user_id"] == alice.user_id, r.text
    assert _balance(mail_api, alice) == Decimal("10.00")
    assert _balance(mail_api, mallory) == 0 and _trial_rows(mail_api, mallory.user_id) == 0
    assert _me(mail_api, mallory)["email_verified"] is False and _me(mail_api, alice)["email_verified"] is True


@pytest.mark.parametrize(
    "token",
    ["", "x", "A" * 15, "A" * 128, "A" * 129, "A" * 100_000, "../../etc/passwd", "tok\x00en" * 4, "ü" * 20, 123, None,
     ["a"], {"a": 1}],
)  # fmt: skip
def test_garbage_and_oversized_tokens_get_4xx_naming_the_token(mail_api: TestClient, token: Any) -> None:
    who = signup(mail_api, "garbage@example.com")
    r = _verify(mail_api, token)
    assert 400 <= r.status_code < 500, r.text
    assert "token" in r.text, r.text
    assert _balance(mail_api, who) == 0 and _trial_rows(mail_api, who.user_id) == 0


def test_a_token_of_the_longest_length_that_matches_nothing_is_422(mail_api: TestClient) -> None:
    r = _verify(mail_api, "A" * links.TOKEN_MAX)
    assert r.status_code == 422 and r.json()["detail"].startswith("token"), r.text
    r = _verify(mail_api, "A" * (links.TOKEN_MAX + 1))
    assert r.status_code == 422 and "token" in r.text, r.text


def test_eight_redeems_of_one_link_at_once_credit_once(mail_api: TestClient, inbox: Inbox) -> None:
    who = signup(mail_api, "race@example.com")
    inbox.wait(1)
    token = inbox.token()
    results, errors = at_once(*[lambda: _verify(mail_api, token) for _ in range(8)])
    assert errors == []
    codes = sorted(r.status_code for r in results)
    assert codes == [200] + [409] * 7, [r.text for r in results]
    assert _balance(mail_api, who) == Decimal("10.00") and _trial_rows(mail_api, who.user_id) == 1


def test_resend_is_throttled_and_needs_a_login(mail_api: TestClient, inbox: Inbox, clock: Clock) -> None:
    who = signup(mail_api, "resend@example.com")
    assert mail_api.post(f"{API}/verify/resend").status_code == 401
    for _ in range(verification.RESEND.capacity):
        r = mail_api.post(f"{API}/verify/resend", headers=who.headers)
        assert r.status_code == 202 and r.json()["sent_to"] == "resend@example.com", r.text
    r = mail_api.post(f"{API}/verify/resend", headers=who.headers)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0, r.text
    inbox.wait(1 + verification.RESEND.capacity)
    time.sleep(0.2)
    assert len(inbox.received) == 1 + verification.RESEND.capacity  # the refused one sent nothing
    clock.now += verification.RESEND.step
    assert mail_api.post(f"{API}/verify/resend", headers=who.headers).status_code == 202  # one more per step


def test_signup_succeeds_when_the_mail_server_is_down(
    db_url: str, tmp_path: Path, cheap_password_hashing: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="suanli.mail")
    with _app(db_url, tmp_path / "home", f"smtp://127.0.0.1:{free_port()}") as api:  # nothing listens there
        who = signup(api, "down@example.com")
        assert _balance(api, who) == 0 and _me(api, who)["trial_pending"] is True
        assert api.post(f"{API}/verify/resend", headers=who.headers).status_code == 202
        deadline = time.monotonic() + 15
        while sum("verification mail not sent" in r.getMessage() for r in caplog.records) < 2:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
    assert "down@example.com" in caplog.text


def test_unknown_tokens_never_take_the_write_lock(mail_api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    db = mail_api.app.state.server.db  # type: ignore[attr-defined]
    writes: list[int] = []
    real = db.write

    def counted() -> Any:
        writes.append(1)
        return real()

    monkeypatch.setattr(db, "write", counted)
    for token in ("A" * 43, "garbage!", "A" * 128):
        assert _verify(mail_api, token).status_code == 422
    assert writes == []
