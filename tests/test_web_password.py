"""The console's side of passwords, in-process with a real SMTP server: the keys page changes the password (the two
new ones must agree, a wrong current one is said at its field, other sessions end and this browser's stays); the
login page leads to /forgot, which answers the same for any address; the mailed link's page changes nothing on GET
(mail scanners fetch it) and sets the password on POST, once; a bad token is said at the page, never echoed."""

from __future__ import annotations

import html
import re
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.control.accounts import links
from tests.control_plane import bearer
from tests.mail_helpers import BROWSER, Inbox, inbox_fixture, mail_api_fixture  # noqa: F401  (the fixtures inbox and mail_api)
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

EN = {"Accept-Language": "en"}
RESET = re.compile(r"/reset\?token=([A-Za-z0-9_-]+)")


def _login_status(api: TestClient, email: str, password: str) -> int:
    return api.post("/api/v1/login", json={"email": email, "password": password}).status_code


def _reset_token(inbox: Inbox) -> str:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with inbox.lock:
            bodies = [m.get_body(("plain",)).get_content() for _, m in inbox.received  # type: ignore[union-attr]
                      if m["Subject"] == "Reset your suanli password"]  # fmt: skip
        if bodies:
            m = RESET.search(bodies[0])
            assert m is not None, bodies[0]
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError("no reset link received")


def test_the_keys_page_changes_the_password_and_keeps_this_browser(mail_api: TestClient) -> None:
    c = Console(mail_api)
    c.signup("pw-web@example.com")
    other = mail_api.post("/api/v1/login", json={"email": "pw-web@example.com", "password": "tenant-password"})
    phone = other.json()["token"]
    page = c.get("/keys", headers=EN).text
    assert 'id="password-form"' in page and 'autocomplete="current-password"' in page
    forged = mail_api.post("/keys/password", data={"current_password": "tenant-password", "new_password": "x" * 9,
                                                   "new_password_again": "x" * 9}, follow_redirects=False)  # fmt: skip
    assert forged.status_code == 403  # no CSRF field
    differ = c.post("/keys/password", {"current_password": "tenant-password", "new_password": "new-password-1",
                                       "new_password_again": "new-password-2"}, csrf_from="/keys", headers=EN)  # fmt: skip
    assert differ.status_code == 422 and 'id="new-password-again-error"' in differ.text
    wrong = c.post("/keys/password", {"current_password": "guess-1234", "new_password": "new-password-1",
                                      "new_password_again": "new-password-1"}, csrf_from="/keys", headers=EN)  # fmt: skip
    assert wrong.status_code == 422 and 'id="current-password-error"' in wrong.text, wrong.text
    short = c.post("/keys/password", {"current_password": "tenant-password", "new_password": "short",
                                      "new_password_again": "short"}, csrf_from="/keys", headers=EN)  # fmt: skip
    assert short.status_code == 422 and 'id="new-password-error"' in short.text, short.text
    assert _login_status(mail_api, "pw-web@example.com", "tenant-password") == 200  # nothing changed yet
    ok = c.post("/keys/password", {"current_password": "tenant-password", "new_password": "new-password-1",
                                   "new_password_again": "new-password-1"}, csrf_from="/keys", headers=EN)  # fmt: skip
    assert ok.status_code == 303 and ok.headers["location"] == "/keys", ok.headers
    shown = c.get("/keys", headers=EN)
    assert shown.status_code == 200  # this browser is still logged in
    notice = re.search(r'id="password-changed">([^<]*)<', shown.text)
    assert notice and notice.group(1).endswith(": 2"), shown.text  # the phone and the check's login
    assert 'id="password-changed"' not in c.get("/keys", headers=EN).text  # said once
    assert mail_api.get("/api/v1/me", headers=bearer(phone)).status_code == 401
    assert _login_status(mail_api, "pw-web@example.com", "new-password-1") == 200
    title = re.search(r"<title>(.*?)</title>", shown.text, re.S)
    assert title and "<" not in title.group(1) and shown.text.count('id="password-form"') == 1
    assert 'id="password-changed"' not in c.get("/keys?password=5", headers=EN).text  # a link cannot make it say so


def test_forgot_and_the_mailed_link_set_a_new_password_once(mail_api: TestClient, inbox: Inbox) -> None:
    c = Console(mail_api)
    c.signup("lost@example.com")
    anon = Console(TestClient(mail_api.app, base_url=BROWSER))
    assert 'href="/forgot"' in anon.get("/login", headers=EN).text
    for email in ("lost@example.com", "nobody@example.com"):
        r = anon.post("/forgot", {"email": email}, csrf_from="/forgot", headers=EN)
        assert r.status_code == 200 and 'id="forgot-sent"' in r.text and "If an account has this address" in r.text
    bad = anon.post("/forgot", {"email": "not-an-address"}, csrf_from="/forgot", headers=EN)
    assert bad.status_code == 422 and 'id="forgot-error"' in bad.text
    token = _reset_token(inbox)
    for _ in range(3):  # a mail scanner's GETs spend nothing
        page = anon.get(f"/reset?token={token}", headers=EN)
        assert page.status_code == 200 and f'value="{token}"' in page.text and 'action="/reset"' in page.text
    assert _login_status(mail_api, "lost@example.com", "tenant-password") == 200
    differ = anon.post("/reset", {"token": token, "new_password": "found-password-1",
                                  "new_password_again": "found-password-2"}, csrf_from="/forgot", headers=EN)  # fmt: skip
    assert differ.status_code == 422 and 'id="new-password-again-error"' in differ.text
    r = anon.post("/reset", {"token": token, "new_password": "found-password-1",
                             "new_password_again": "found-password-1"}, csrf_from="/forgot", headers=EN)  # fmt: skip
    assert r.status_code == 200 and 'id="reset-done"' in r.text and "lost@example.com" in r.text, r.text
    assert "0 SSH key(s) were removed" in r.text
    assert c.get("/keys").status_code in (302, 303)  # the old browser session ended: back to the login page
    again = anon.post("/reset", {"token": token, "new_password": "thief-password-1",
                                 "new_password_again": "thief-password-1"}, csrf_from="/forgot", headers=EN)  # fmt: skip
    assert again.status_code == 409 and 'id="reset-error"' in again.text and "used" in again.text
    assert _login_status(mail_api, "lost@example.com", "found-password-1") == 200


@pytest.mark.parametrize("token", ["", "nope", "A" * 129, "<script>alert(1)</script>"])
def test_a_bad_reset_token_is_said_on_the_page(mail_api: TestClient, token: str) -> None:
    anon = Console(mail_api)
    r = anon.post("/reset", {"token": token, "new_password": "long-enough-1", "new_password_again": "long-enough-1"},
                  csrf_from="/forgot", headers=EN)  # fmt: skip
    assert r.status_code == 422 and 'id="reset-error"' in r.text and "token" in r.text, r.text
    assert "<script>alert(1)" not in r.text and 'name="new_password"' not in r.text  # no form for a bad link
    page = anon.get(f"/reset?token={'A' * 5000}").text
    assert "A" * (links.TOKEN_MAX + 2) not in page  # not echoed at any length


def test_forgot_without_mail_says_to_ask_the_operator(api: Any) -> None:
    anon = Console(api)
    r = anon.post("/forgot", {"email": "someone@example.com"}, csrf_from="/forgot", headers=EN)
    assert r.status_code == 409 and "operator" in html.unescape(r.text), r.text


def test_oversized_and_odd_values_on_the_console_forms_are_refused_not_500(mail_api: TestClient) -> None:
    c = Console(mail_api)
    c.signup("odd-web@example.com")
    huge, nul = "p" * 5000, "new-pass\x00word"
    for form in ({"current_password": huge, "new_password": "new-password-1", "new_password_again": "new-password-1"},
                 {"current_password": "tenant-password", "new_password": huge, "new_password_again": huge},
                 {"current_password": "tenant-password", "new_password": nul, "new_password_again": nul}):  # fmt: skip
        r = c.post("/keys/password", form, csrf_from="/keys", headers=EN)
        assert r.status_code in (400, 422) and "password" in r.text, r.text[:300]
    assert _login_status(mail_api, "odd-web@example.com", "tenant-password") == 200
    anon = Console(TestClient(mail_api.app, base_url=BROWSER))
    for email in ("x" * 5000 + "@example.com", "a@b.c\r\nBcc: thief@example.com", ""):
        r = anon.post("/forgot", {"email": email}, csrf_from="/forgot", headers=EN)
        assert r.status_code in (400, 422) and 'id="forgot-error"' in r.text, r.text[:300]
    r = anon.post("/reset", {"token": "A" * 43, "new_password": huge, "new_password_again": huge}, csrf_from="/forgot",
                  headers=EN)  # fmt: skip
    assert r.status_code == 422 and ("new_password" in r.text or "token" in r.text), r.text[:300]
