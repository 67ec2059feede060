"""One trial credit per mailbox, attacks first: `me+1@…`, `me+2@…` (plus-addressing, which Gmail, Outlook, iCloud,
Fastmail and Proton deliver to one inbox) and Gmail's dotted spellings are one mailbox, so verifying each of them
earns nothing after the first; nor does signing up without mail, nor two verifications at once. In-process on both
databases, with a real SMTP server (aiosmtpd) receiving the links."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import func, select

from suanli.control.accounts import trials
from suanli.db.access import TrialMailbox
from suanli.mail import addresses
from tests.concurrency import at_once
from tests.control_plane import Tenant
from tests.mail_helpers import Inbox, inbox_fixture, mail_api_fixture  # noqa: F401  (the fixtures inbox and mail_api)

API = "/api/v1"


@pytest.mark.parametrize(
    ("email", "mailbox"),
    [
        ("me@example.com", "me@example.com"),
        ("me+gpu@example.com", "me@example.com"),
        ("me+a+b@example.com", "me@example.com"),
        ("m.e+x@example.com", "m.e@example.com"),  # dots matter outside Gmail
        ("M.E.+x@gmail.com", "me@gmail.com"),
        ("m.e@googlemail.com", "me@gmail.com"),
        ("+x@example.com", "+x@example.com"),  # nothing before the tag: the address is its own mailbox
        ("...@gmail.com", "...@gmail.com"),
        ("me@gmail.com.", "me@gmail.com"),  # a fully qualified domain: relays strip the dot
        ("m.e+x@GMAIL.COM..", "me@gmail.com"),
        ("me@bücher.de", "me@xn--bcher-kva.de"),  # an internationalised domain's two spellings
        ("me@xn--bcher-kva.de", "me@xn--bcher-kva.de"),
        ("anything@me.fastmail.com", "me@fastmail.com"),  # Fastmail's subdomain addressing
        ("x+y@me.fastmail.fm", "me@fastmail.fm"),
        ("a@b.me.fastmail.com", "a@b.me.fastmail.com"),  # not one of Fastmail's forms
        ("me@protonmail.com", "me@proton.me"),  # one account, several domains
        ("me@protonmail.ch", "me@proton.me"),
        ("me+x@pm.me", "me@proton.me"),
        ("me@me.com", "me@icloud.com"),
        ("me@mac.com", "me@icloud.com"),
        ("me@outlook.com", "me@outlook.com"),  # Outlook's and Hotmail's are separate accounts
    ],
)
def test_addresses_that_reach_one_inbox_are_one_mailbox(email: str, mailbox: str) -> None:
    assert addresses.mailbox(email) == mailbox


@given(st.from_regex(r"[a-z0-9.]{1,12}(\+[a-z0-9+.]{0,8})?@(gmail\.com|googlemail\.com|example\.org)", fullmatch=True))
def test_a_mailbox_is_its_own_mailbox_and_keeps_the_domain(email: str) -> None:
    box = addresses.mailbox(email)
    assert addresses.mailbox(box) == box  # idempotent
    assert box.rsplit("@", 1)[1] in ("gmail.com", "example.org")
    assert len(trials.mailbox_key(email)) == 64 and trials.mailbox_key(email) == trials.mailbox_key(box)


def _signup(api: TestClient, email: str) -> tuple[Tenant, Any]:
    r = api.post(f"{API}/signup", json={"email": email, "password": "tenant-password"})
    assert r.status_code == 201, r.text
    body = r.json()
    return Tenant(email, body["token"], body["user"]["id"], body["org"]["id"]), body


def _balance(api: TestClient, who: Tenant) -> Decimal:
    r = api.get(f"{API}/orgs/{who.org_id}/balance", headers=who.headers)
    assert r.status_code == 200, r.text
    return Decimal(r.json()["exact"])


def _verify(api: TestClient, token: str) -> Any:
    r = api.post(f"{API}/verify", json={"token": token})
    assert r.status_code == 200, r.text
    return r.json()


def test_plus_addresses_and_gmail_dots_earn_one_trial(mail_api: TestClient, inbox: Inbox) -> None:
    first, body = _signup(mail_api, "renter@gmail.com")
    assert body["trial_pending"] is True
    inbox.wait(1)
    assert _verify(mail_api, inbox.token())["credited"] == "10.00"
    for n, alias in enumerate(("renter+1@gmail.com", "r.enter@gmail.com", "R.E.N.T.E.R+free@googlemail.com"), 2):
        who, body = _signup(mail_api, alias)
        assert body["trial_pending"] is False, alias  # said at signup: this mailbox had its trial
        me = mail_api.get(f"{API}/me", headers=who.headers).json()
        assert me["trial_pending"] is False, alias
        inbox.wait(n)
        with inbox.lock:
            mailed = inbox.received[-1][1].get_body(("plain",)).get_content()  # type: ignore[union-attr]
        assert "verify it:" in mailed and "trial credit" not in mailed, mailed  # the mail promises nothing either
        done = _verify(mail_api, inbox.token())
        assert done["credited"] == "0.00" and done["email_verified"] is True, alias  # verified, not credited
        assert _balance(mail_api, who) == 0, alias
    assert _balance(mail_api, first) == Decimal(10)
    _, body = _signup(mail_api, "renter@example.com")  # another domain is another mailbox
    assert body["trial_pending"] is True
    inbox.wait(5)
    assert _verify(mail_api, inbox.token())["credited"] == "10.00"


def test_two_aliases_verified_at_once_earn_one_trial(mail_api: TestClient, inbox: Inbox) -> None:
    users = [_signup(mail_api, f"racer+{i}@example.com")[0] for i in range(4)]
    inbox.wait(4)
    tokens = [inbox.token(i) for i in range(4)]
    results, errors = at_once(*[lambda t=t: _verify(mail_api, t) for t in tokens])  # type: ignore[misc]
    assert errors == [] and len(results) == 4
    assert sorted(r["credited"] for r in results) == ["0.00", "0.00", "0.00", "10.00"]
    assert sum(_balance(mail_api, u) for u in users) == Decimal(10)
    with mail_api.app.state.server.db.read() as s:  # type: ignore[attr-defined]
        assert s.scalar(select(func.count()).select_from(TrialMailbox)) == 1


@pytest.mark.parametrize("email", ["me@gmail.com.", "me@gmail..com", "me@.gmail.com"])
def test_a_domain_with_a_stray_dot_is_no_address(api: TestClient, email: str) -> None:
    """`me@gmail.com.` reaches `me@gmail.com` (relays strip the dot) but would have been another mailbox here."""
    r = api.post(f"{API}/signup", json={"email": email, "password": "tenant-password"})
    assert r.status_code == 422 and r.json()["detail"].startswith("email"), r.text


def test_without_mail_a_plus_address_signs_up_without_a_second_trial(api: TestClient) -> None:
    first, body = _signup(api, "nomail@example.com")
    assert body["balance"] == "10.00"
    second, body = _signup(api, "nomail+again@example.com")
    assert body["balance"] == "0.00" and body["trial_pending"] is False
    assert _balance(api, second) == 0 and _balance(api, first) == Decimal(10)
