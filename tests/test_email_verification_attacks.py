"""E-mail verification attacked by a stranger: an address whose To: header names someone else, two links of one user
redeemed at once (PostgreSQL row locks), a user an operator made without the trial credit, the link's host, and the
SMTP password kept out of what the server says. In-process on both databases, a real SMTP server (aiosmtpd)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.api.app import create_app
from suanli.control.accounts import verification
from suanli.db.models import User
from suanli.mail import Mail, MailError, outbox
from suanli.mail.smtp import SmtpMailer
from tests.concurrency import at_once
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, Tenant, bearer, settings, signup
from tests.mail_helpers import BROWSER, SITE, Inbox, inbox_fixture, mail_api_fixture, smtp_server  # noqa: F401  (the fixtures inbox and mail_api)
from tests.web_helpers import Console

API = "/api/v1"


def _balance(api: TestClient, who: Tenant) -> Decimal:
    r = api.get(f"{API}/orgs/{who.org_id}/balance", headers=who.headers)
    assert r.status_code == 200, r.text
    return Decimal(r.json()["exact"])


def _verify(api: TestClient, token: Any) -> Any:
    return api.post(f"{API}/verify", json={"token": token})


@pytest.mark.parametrize("email", ["x,thief@evil.example", "x<thief@evil.example>", "thief@evil.example,x"])
def test_an_address_that_parses_as_someone_else_mails_nobody_else(
    mail_api: TestClient, inbox: Inbox, email: str
) -> None:
    """The account's address passes signup's check but, written into To:, names another mailbox (smtplib takes the
    recipients from To:). Mailing it there would let one mailbox verify any number of accounts (`1,thief@…`,
    `2,thief@…`), and mail people who never signed up."""
    signup(mail_api, email)
    signup(mail_api, "plain@example.com")  # a control: its mail arrives, so the first had its chance
    inbox.wait(1)
    time.sleep(0.5)
    for rcpt, msg in inbox.received:
        assert rcpt == ["plain@example.com"], (rcpt, msg["To"])


def test_the_mailer_sends_to_exactly_the_address_given(inbox: Inbox) -> None:
    mailer = SmtpMailer(inbox.url, "noreply@example.com")
    mailer.send(Mail("ok.user+tag@example.com", "s", "b"))
    for bad in (
        "a,thief@evil.example",
        "x<thief@evil.example>",
        "Name <thief@evil.example>",
        "",
        "nobody",
        "victim@[127.0.0.1]",
        "victim@[IPv6:::1]",
    ):  # an IP literal: the relay would connect where told
        with pytest.raises(MailError):
            mailer.send(Mail(bad, "s", "b"))
    [(rcpt, msg)] = inbox.wait(1)
    assert rcpt == ["ok.user+tag@example.com"] and msg["To"] == "ok.user+tag@example.com"


def test_two_links_of_one_user_redeemed_at_once_credit_once_without_a_500(mail_api: TestClient, inbox: Inbox) -> None:
    """Each redeem marks its own link used, then the user's other links: on PostgreSQL two at once each hold the row
    the other wants next."""
    for i in range(12):  # a deadlock needs the two to interleave: most rounds find one
        who = signup(mail_api, f"pair{i}@example.com")
        assert mail_api.post(f"{API}/verify/resend", headers=who.headers).status_code == 202
        got = inbox.wait(2 * (i + 1))
        tokens = [inbox.token(j) for j, (rcpt, _) in enumerate(got) if rcpt == [who.email]]
        assert len(tokens) == 2
        results, errors = at_once(*[lambda t=t: _verify(mail_api, t) for t in tokens])
        assert errors == []
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 409], [r.text for r in results]
        assert _balance(mail_api, who) == Decimal("10.00")


def test_a_user_an_operator_made_without_the_trial_credit_cannot_mail_it_to_themselves(
    mail_api: TestClient, inbox: Inbox
) -> None:
    r = mail_api.post(f"{API}/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
    admin = bearer(r.json()["token"])
    r = mail_api.post(f"{API}/admin/users", json={"email": "staff@example.com", "password": "staff-password"},
                      headers=admin)  # fmt: skip
    assert r.status_code == 201, r.text
    r = mail_api.post(f"{API}/login", json={"email": "staff@example.com", "password": "staff-password"})
    me = mail_api.get(f"{API}/me", headers=bearer(r.json()["token"])).json()
    who = Tenant("staff@example.com", r.json()["token"], me["user"]["id"], me["user"]["personal_org_id"])
    assert mail_api.get(f"{API}/me", headers=who.headers).json()["trial_pending"] is False
    assert mail_api.post(f"{API}/verify/resend", headers=who.headers).status_code == 202
    inbox.wait(1)
    r = _verify(mail_api, inbox.token())  # the address is proven; the credit it was never given stays ungiven
    assert r.status_code == 200 and r.json()["email_verified"] is True and Decimal(r.json()["credited"]) == 0, r.text
    assert _balance(mail_api, who) == 0


def test_a_signups_new_link_still_grants_the_trial_credit(mail_api: TestClient, inbox: Inbox) -> None:
    who = signup(mail_api, "again@example.com")
    inbox.wait(1)
    assert mail_api.post(f"{API}/verify/resend", headers=who.headers).status_code == 202
    inbox.wait(2)
    r = _verify(mail_api, inbox.token(-1))  # the second link, not the signup's
    assert r.status_code == 200 and Decimal(r.json()["credited"]) == Decimal("10.00"), r.text
    assert _balance(mail_api, who) == Decimal("10.00")


def test_the_link_names_public_url_whatever_host_the_request_said(mail_api: TestClient, inbox: Inbox) -> None:
    r = mail_api.post(f"{API}/signup", json={"email": "host@example.com", "password": "tenant-password"},
                      headers={"Host": "evil.example", "X-Forwarded-Host": "evil.example"})  # fmt: skip
    assert r.status_code == 201, r.text
    [(_, msg)] = inbox.wait(1)
    body = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert f"{SITE}/verify?token=" in body and "evil" not in body


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")  # such a server on purpose
def test_the_smtp_password_is_in_no_answer_or_log(
    db_url: str, tmp_path: Path, cheap_password_hashing: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "s3cret-Passw0rd"
    with smtp_server(user="mailer", password="other") as box:  # no TLS, so no login: the refusal is logged
        url = box.url.replace("smtp://", f"smtp://mailer:{secret}@")
        with TestClient(create_app(settings(tmp_path / "home", db_url, smtp_url=url, public_url=SITE))) as api:
            who = signup(api, "pw@example.com")
            deadline = time.monotonic() + 15
            while "verification mail not sent" not in caplog.text:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            seen = [api.get(p).text for p in ("/openapi.json", "/docs")]
            seen.append(api.get(f"{API}/me", headers=who.headers).text)
            seen.append(repr(api.app.state.server.settings) + repr(api.app.state.server.mailer))  # type: ignore[attr-defined]
    assert box.logins == []  # never sent in the clear
    for text in [caplog.text, *seen]:
        assert secret not in text


@contextmanager
def silent_smtp_server() -> Iterator[str]:
    """A mail server that takes connections and never says a word (hung, or a tarpit)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1000)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"smtp://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        sock.close()


def _mail_threads() -> int:
    return sum(t.name == "suanli-mail" and t.is_alive() for t in threading.enumerate())


def test_a_flood_of_signups_while_the_mail_server_hangs_starts_a_bounded_number_of_threads(
    db_url: str, tmp_path: Path, cheap_password_hashing: None
) -> None:
    with silent_smtp_server() as url:
        cfg = settings(tmp_path / "home", db_url, smtp_url=url, public_url=SITE, signup_per_address_per_hour=1000)
        with TestClient(create_app(cfg)) as api:
            api.app.state.server.mailer.timeout_s = 3.0  # type: ignore[attr-defined]
            for i in range(3 * outbox.MAIL_THREADS):
                signup(api, f"flood{i}@example.com")
            assert _mail_threads() <= outbox.MAIL_THREADS


def test_markup_in_the_address_is_escaped_on_the_verify_and_wallet_pages(mail_api: TestClient) -> None:
    """Signup's check lets `<`, `>` and quotes into an address; the console shows the address after a redeem and
    after a resend."""
    evil = "<script>alert(1)</script>\"'@evil.example"
    c = Console(mail_api)
    c.signup(evil)
    server = mail_api.app.state.server  # type: ignore[attr-defined]
    with server.db.write() as s, s.begin():
        user = s.scalar(select(User).where(User.email == evil))
        token = verification.issue(s, user, datetime.now(UTC), grants_trial=True)
    r = c.post("/wallet/verify-resend", csrf_from="/wallet", headers={"Accept-Language": "en"})
    assert r.status_code == 200 and 'id="verify-note"' in r.text, r.text
    assert "<script>alert(1)" not in r.text
    r = c.post("/verify", {"token": token}, csrf_from=f"/verify?token={token}", headers={"Accept-Language": "en"})
    assert r.status_code == 200 and 'id="verified"' in r.text, r.text
    assert "<script>alert(1)" not in r.text and "&lt;script&gt;" in r.text


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")  # such a server on purpose
def test_the_smtp_password_is_never_sent_without_tls() -> None:
    # smtp:// with a login sent the password in the clear when the server offered no STARTTLS (or someone on the
    # path stripped the offer)
    with smtp_server(user="relay", password="secret-pw") as box:  # offers no STARTTLS: as if stripped
        mailer = SmtpMailer(box.url.replace("smtp://", "smtp://relay:secret-pw@"), "noreply@example.com")
        with pytest.raises(MailError):
            mailer.send(Mail("someone@example.com", "s", "b"))
    assert box.logins == []


@pytest.mark.parametrize(
    "token", ["", "\x00", "A" * 200_000, "\u202eA" * 50, "A" * 43 + "\r\nSet-Cookie: x=1", "%00", "<>\"'&"]
)
def test_odd_tokens_on_the_console_page_are_4xx_or_a_page_never_a_500(mail_api: TestClient, token: str) -> None:
    c = Console(mail_api)
    page = c.get("/verify", params={"token": token[:20_000]})  # the client takes no longer URL
    assert page.status_code == 200 and "Set-Cookie: x" not in str(page.headers), page.text[:500]
    r = c.post("/verify", {"token": token}, csrf_from="/verify?token=x")
    assert 400 <= r.status_code < 500 and 'id="verify-error"' in r.text, r.text[:500]


def test_the_console_redeems_nothing_without_its_csrf_field(mail_api: TestClient, inbox: Inbox) -> None:
    who = signup(mail_api, "csrf@example.com")
    inbox.wait(1)
    r = mail_api.post("/verify", data={"token": inbox.token()}, follow_redirects=False)
    assert r.status_code == 403, r.text
    assert _balance(mail_api, who) == 0


def test_one_address_gets_a_bounded_number_of_links_ever(mail_api: TestClient, inbox: Inbox) -> None:
    # Someone who signs up with a victim's address holds it (an unverified account does not expire) and could have
    # a link mailed there every 20 minutes for ever: the links of one account are bounded in all.
    who = signup(mail_api, "victim@example.com")
    inbox.wait(1)
    server = mail_api.app.state.server  # type: ignore[attr-defined]
    with server.db.write() as s, s.begin():
        user = s.get(User, who.user_id)
        for _ in range(verification.MAX_LINKS - 1):  # the signup's was the first
            verification.issue(s, user, datetime.now(UTC), grants_trial=True)
    r = mail_api.post(f"{API}/verify/resend", headers=who.headers)
    assert r.status_code == 409 and "links" in r.json()["detail"], r.text
    time.sleep(0.3)
    assert len(inbox.received) == 1


def test_the_wallets_resend_needs_the_csrf_field_and_a_login(mail_api: TestClient, inbox: Inbox) -> None:
    c = Console(mail_api)
    c.signup("wallet-csrf@example.com")
    inbox.wait(1)
    r = mail_api.post("/wallet/verify-resend", data={}, follow_redirects=False)  # the session cookie, no CSRF field
    assert r.status_code == 403, r.text
    stranger = Console(TestClient(mail_api.app, base_url=BROWSER))  # no session at all
    r = stranger.post("/wallet/verify-resend", csrf_from="/login")
    assert r.status_code in (303, 401, 403) and "verify-note" not in r.text, r.text
    time.sleep(0.3)
    assert len(inbox.received) == 1  # only the signup's link was mailed


def test_a_tenants_resend_mails_only_its_own_address(mail_api: TestClient, inbox: Inbox) -> None:
    alice = signup(mail_api, "alice-r@example.com")
    bob = signup(mail_api, "bob-r@example.com")
    inbox.wait(2)
    for _ in range(3):
        assert mail_api.post(f"{API}/verify/resend", headers=bob.headers).status_code == 202
    inbox.wait(5)
    time.sleep(0.3)
    rcpts = [rcpt for rcpt, _ in inbox.received]
    assert rcpts.count(["alice-r@example.com"]) == 1 and rcpts.count(["bob-r@example.com"]) == 4, rcpts
    assert _balance(mail_api, alice) == 0  # nothing of bob's touches alice
