"""The console's side of e-mail verification, in-process with a real SMTP server: the link's page changes nothing on
GET (mail scanners fetch it), its button redeems it once, a bad token is said at the page, and the wallet says the
trial credit waits and offers a new link (throttled like the API)."""

from __future__ import annotations

import html
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.control.accounts import links, verification
from tests.control_plane import bearer
from tests.mail_helpers import BROWSER, Inbox, inbox_fixture, mail_api_fixture  # noqa: F401  (the fixtures inbox and mail_api)
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

EN = {"Accept-Language": "en"}


def _balance(api: Any, who: Console) -> str:
    token = api.cookies.get("__Host-suanli_session")  # users are on HTTPS (public_url)
    me = api.get("/api/v1/me", headers=bearer(token)).json()
    r = api.get(f"/api/v1/orgs/{me['user']['personal_org_id']}/balance", headers=bearer(token))
    return str(r.json()["balance"])


def test_the_link_page_changes_nothing_until_its_button_is_pressed(mail_api: TestClient, inbox: Inbox) -> None:
    c = Console(mail_api)
    c.signup("web@example.com")
    wallet = c.get("/wallet", headers=EN).text
    assert 'id="verify-email"' in wallet and "Verify your e-mail to receive the trial credit" in wallet
    inbox.wait(1)
    token = inbox.token()
    scanner = Console(
        TestClient(mail_api.app, base_url=BROWSER)
    )  # no session: a mail scanner, or the user on another device
    for _ in range(3):
        page = scanner.get(f"/verify?token={token}", headers=EN)
        assert page.status_code == 200 and f'value="{token}"' in page.text and 'action="/verify"' in page.text
    assert _balance(mail_api, c) == "0.00"  # GETs spent nothing
    r = scanner.post("/verify", {"token": token}, csrf_from=f"/verify?token={token}", headers=EN)
    assert r.status_code == 200 and 'id="verified"' in r.text and "web@example.com is verified" in r.text, r.text
    assert "¥10.00" in r.text and _balance(mail_api, c) == "10.00"
    again = scanner.post("/verify", {"token": token}, csrf_from=f"/verify?token={token}", headers=EN)
    assert again.status_code == 409 and 'id="verify-error"' in again.text and "used" in again.text
    assert _balance(mail_api, c) == "10.00"
    assert 'id="verify-email"' not in c.get("/wallet", headers=EN).text  # nothing left to verify


@pytest.mark.parametrize("token", ["", "nope", "A" * 129, "<script>alert(1)</script>"])
def test_a_bad_token_is_said_on_the_page(mail_api: TestClient, token: str) -> None:
    c = Console(mail_api)
    r = c.post("/verify", {"token": token}, csrf_from="/verify?token=x", headers=EN)
    assert r.status_code == 422 and 'id="verify-error"' in r.text and "token" in r.text, r.text
    assert "<script>alert(1)" not in r.text
    page = c.get(f"/verify?token={'A' * 5000}").text
    assert "A" * (links.TOKEN_MAX + 2) not in page  # not echoed at any length


def test_the_wallet_sends_a_new_link_until_the_limit(mail_api: TestClient, inbox: Inbox) -> None:
    c = Console(mail_api)
    c.signup("resend-web@example.com")
    forged = mail_api.post("/wallet/verify-resend", data={}, follow_redirects=False)  # no CSRF field
    assert forged.status_code == 403, forged.text
    for _ in range(verification.RESEND.capacity):
        r = c.post("/wallet/verify-resend", csrf_from="/wallet", headers=EN)
        assert r.status_code == 200 and "A new link is on its way to resend-web@example.com" in r.text, r.text
    r = c.post("/wallet/verify-resend", csrf_from="/wallet", headers=EN)
    assert r.status_code == 429 and 'id="verify-note"' in r.text and "too many" in html.unescape(r.text)
    inbox.wait(1 + verification.RESEND.capacity)
    time.sleep(0.2)
    assert len(inbox.received) == 1 + verification.RESEND.capacity  # the forged and the refused sent nothing
