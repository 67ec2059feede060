"""Passwords after signup, attacks first: a stolen token cannot change the password without the current one (and its
guesses are throttled like logins); a new password ends every other session and token; a reset link is asked for
without telling who is registered, cannot flood a mailbox, works once, expires, loses to a newer password, and 8
redeems of one link at once set one password. In-process on both databases, with a real SMTP server (aiosmtpd)
receiving the mail and the test clicking the link it finds there."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.api.app import create_app
from suanli.api.routers import auth as auth_routes
from suanli.api.routers import passwords as routes
from suanli.control.accounts import accounts, password_resets
from suanli.control.ids import token_hash
from suanli.db.access import PasswordReset
from suanli.db.models import ProxySession, Workload
from tests.concurrency import at_once
from tests.control_plane import Tenant, bearer, settings, signup
from tests.mail_helpers import BROWSER, SITE, Inbox, inbox_fixture, mail_api_fixture  # noqa: F401  (the fixtures inbox and mail_api)

API = "/api/v1"
RESET_LINK = re.compile(r"https?://\S+/reset\?token=([A-Za-z0-9_-]+)")


def _login(api: TestClient, email: str, password: str) -> int:
    return api.post(f"{API}/login", json={"email": email, "password": password}).status_code


def _change(api: TestClient, token: str, current: str, new: str) -> Any:
    return api.put(f"{API}/me/password", json={"current_password": current, "new_password": new},
                   headers=bearer(token))  # fmt: skip


def _works(api: TestClient, token: str) -> bool:
    return api.get(f"{API}/me", headers=bearer(token)).status_code == 200


def _reset_tokens(inbox: Inbox, count: int) -> list[str]:
    """The tokens of the first `count` reset links received (mail goes out on threads: in any order, and among
    the signups' verification mails)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with inbox.lock:
            bodies = [m.get_body(("plain",)).get_content() for _, m in inbox.received  # type: ignore[union-attr]
                      if m["Subject"] == "Reset your suanli password"]  # fmt: skip
        if len(bodies) >= count:
            links = [RESET_LINK.search(b) for b in bodies]
            assert all(m is not None and m.group(0).startswith(SITE + "/reset?token=") for m in links), bodies
            return [m.group(1) for m in links if m is not None]
        time.sleep(0.05)
    raise AssertionError(f"{count} reset links not received")


def _verification_tokens(inbox: Inbox) -> list[str]:
    """The tokens of the verification links received so far, waiting up to 15 s for the first."""
    deadline = time.monotonic() + 15
    while True:
        with inbox.lock:
            bodies = [m.get_body(("plain",)).get_content() for _, m in inbox.received]  # type: ignore[union-attr]
        found = [t for b in bodies for t in re.findall(r"/verify\?token=([A-Za-z0-9_-]+)", b)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _second_session(api: TestClient, who: Tenant, password: str = "tenant-password") -> tuple[str, str]:
    """Another login of the user and an API token of theirs: what a thief would hold."""
    r = api.post(f"{API}/login", json={"email": who.email, "password": password})
    assert r.status_code == 200, r.text
    t = api.post(f"{API}/tokens", json={"name": "ci", "expires_in_days": 7}, headers=who.headers)
    assert t.status_code == 201, t.text
    return r.json()["token"], t.json()["token"]


def test_a_token_without_the_current_password_cannot_change_it(api: TestClient) -> None:
    who = signup(api, "held@example.com")
    r = _change(api, who.token, "not-the-password", "thief-password-1")
    assert r.status_code == 422 and r.json()["detail"].startswith("current_password"), r.text
    assert _login(api, who.email, "tenant-password") == 200 and _login(api, who.email, "thief-password-1") == 401
    assert api.put(f"{API}/me/password", json={"current_password": "tenant-password",
                                               "new_password": "thief-password-1"}).status_code == 401  # fmt: skip


def test_guessing_the_current_password_is_throttled_like_logins(api: TestClient) -> None:
    who = signup(api, "guessed@example.com")
    codes = [_change(api, who.token, f"guess-{i:04d}", "thief-password-1").status_code for i in range(6)]
    assert codes[:5] == [422] * 5 and codes[5] == 429, codes
    r = _change(api, who.token, "tenant-password", "new-password-1")  # the right one is throttled too, for now
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
    assert _login(api, who.email, "tenant-password") == 429  # the same buckets as logins


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"current_password": "tenant-password", "new_password": "short"}, "new_password"),
        ({"current_password": "tenant-password", "new_password": "x" * 1025}, "new_password"),
        ({"current_password": "tenant-password", "new_password": "tenant-password"}, "new_password"),
        ({"current_password": "x" * 1025, "new_password": "new-password-1"}, "current_password"),
        ({"current_password": "", "new_password": "new-password-1"}, "current_password"),
        ({"current_password": "tenant-password", "new_password": 12345678}, "new_password"),
        ({"current_password": "tenant-password"}, "new_password"),
    ],
)
def test_a_bad_change_is_refused_naming_its_field(api: TestClient, body: dict[str, Any], field: str) -> None:
    who = signup(api, "fields@example.com")
    r = api.put(f"{API}/me/password", json=body, headers=who.headers)
    assert r.status_code == 422 and field in r.text, r.text
    assert _login(api, who.email, "tenant-password") == 200


def test_a_new_password_ends_every_other_session_and_token(api: TestClient) -> None:
    who = signup(api, "moved@example.com")
    other_login, api_token = _second_session(api, who)
    bystander = signup(api, "bystander@example.com")
    r = _change(api, who.token, "tenant-password", "new-password-1")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "email": "moved@example.com",
        "revoked_tokens": 2,
        "removed_ssh_keys": 0,
        "revoked_endpoint_keys": 0,
    }
    assert _works(api, who.token)  # the session that changed it stays
    assert not _works(api, other_login) and not _works(api, api_token)
    assert _works(api, bystander.token)  # nobody else's
    assert _login(api, who.email, "tenant-password") == 401 and _login(api, who.email, "new-password-1") == 200


def test_forgetting_needs_a_server_that_sends_mail(api: TestClient) -> None:
    signup(api, "nomail@example.com")
    r = api.post(f"{API}/password/forgot", json={"email": "nomail@example.com"})
    assert r.status_code == 409 and r.json()["detail"].startswith("email"), r.text


def test_asking_for_a_link_tells_nobody_who_is_registered(mail_api: TestClient, inbox: Inbox) -> None:
    signup(mail_api, "known@example.com")
    inbox.wait(1)  # the signup's verification mail
    known = mail_api.post(f"{API}/password/forgot", json={"email": " Known@Example.com "})
    unknown = mail_api.post(f"{API}/password/forgot", json={"email": "unknown@example.com"})
    assert known.status_code == unknown.status_code == 202, (known.text, unknown.text)
    assert known.json() == unknown.json()
    assert len(_reset_tokens(inbox, 1)) == 1
    time.sleep(0.5)  # an unknown address's mail would have been sent by now
    assert sorted((m["Subject"], to) for to, m in inbox.received) == [
        ("Reset your suanli password", ["known@example.com"]),
        ("Verify your e-mail address for suanli", ["known@example.com"]),
    ]
    # the throttle per address asked about counts unregistered addresses the same way
    for email in ("known@example.com", "unknown@example.com"):
        codes = [mail_api.post(f"{API}/password/forgot", json={"email": email}).status_code for _ in range(3)]
        assert codes == [202, 202, 429], (email, codes)


def test_asking_from_one_address_is_bounded(mail_api: TestClient, inbox: Inbox) -> None:
    codes = [mail_api.post(f"{API}/password/forgot", json={"email": f"spray{i}@example.com"}).status_code
             for i in range(11)]  # fmt: skip
    assert codes == [202] * 10 + [429], codes


@pytest.mark.parametrize("body", [{"email": "not-an-address"}, {"email": "x" * 255}, {"email": 5}, {},
                                  {"email": "a@example.com", "extra": 1}])  # fmt: skip
def test_a_bad_ask_is_refused_naming_its_field(mail_api: TestClient, body: dict[str, Any]) -> None:
    r = mail_api.post(f"{API}/password/forgot", json=body)
    assert r.status_code == 422 and ("email" in r.text or "extra" in r.text), r.text


def test_the_mailed_link_sets_a_new_password_once_and_signs_out_everywhere(mail_api: TestClient,
                                                                          inbox: Inbox) -> None:  # fmt: skip
    who = signup(mail_api, "forgetful@example.com")
    other_login, api_token = _second_session(mail_api, who)
    assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    with mail_api.app.state.server.db.read() as s:  # type: ignore[attr-defined]
        assert list(s.scalars(select(PasswordReset.token_hash))) == [token_hash(token)]  # its hash only
    r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "fresh-password-1"})
    assert r.status_code == 200 and r.json() == {
        "email": who.email,
        "revoked_tokens": 3,
        "removed_ssh_keys": 0,
        "revoked_endpoint_keys": 0,
    }, r.text
    assert not any(_works(mail_api, t) for t in (who.token, other_login, api_token))
    assert _login(mail_api, who.email, "tenant-password") == 401
    assert _login(mail_api, who.email, "fresh-password-1") == 200
    again = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "thief-password-1"})
    assert again.status_code == 409 and again.json()["detail"].startswith("token"), again.text
    assert _login(mail_api, who.email, "fresh-password-1") == 200


def test_a_reset_proves_the_mailbox_verifying_the_address_and_releasing_the_trial_once(mail_api: TestClient,
                                                                                        inbox: Inbox) -> None:  # fmt: skip
    """The reset link went to the address, as a verification link does: redeeming it verifies the address (the
    verification link mailed at signup is spent with it) and releases a trial credit that waited, once."""
    who = signup(mail_api, "never-clicked@example.com")
    me = mail_api.get(f"{API}/me", headers=who.headers).json()
    assert (me["email_verified"], me["trial_pending"]) == (False, True)
    assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "fresh-password-1"})
    assert r.status_code == 200, r.text
    login = mail_api.post(f"{API}/login", json={"email": who.email, "password": "fresh-password-1"}).json()
    again = Tenant(who.email, login["token"], who.user_id, who.org_id)
    me = mail_api.get(f"{API}/me", headers=again.headers).json()
    assert (me["email_verified"], me["trial_pending"]) == (True, False)
    balance = mail_api.get(f"{API}/orgs/{who.org_id}/balance", headers=again.headers).json()
    assert Decimal(balance["exact"]) == Decimal(10)
    signup_link = _verification_tokens(inbox)[0]
    used = mail_api.post(f"{API}/verify", json={"token": signup_link})
    assert used.status_code == 409 and used.json()["detail"].startswith("token"), used.text  # spent by the reset
    assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    (_, second) = _reset_tokens(inbox, 2)
    assert mail_api.post(f"{API}/password/reset", json={"token": second, "new_password": "fresh-password-2"}).status_code == 200  # fmt: skip
    login = mail_api.post(f"{API}/login", json={"email": who.email, "password": "fresh-password-2"}).json()
    balance = mail_api.get(f"{API}/orgs/{who.org_id}/balance", headers=bearer(login["token"])).json()
    assert Decimal(balance["exact"]) == Decimal(10)  # a second reset credits nothing more


def test_an_operators_user_verified_by_a_reset_gets_no_trial(mail_api: TestClient, inbox: Inbox) -> None:
    """A user the operator made was never promised a trial: a reset verifies them and credits nothing."""
    with mail_api.app.state.server.db.write() as s, s.begin():  # type: ignore[attr-defined]
        _, org = accounts.create_user(s, "made@example.com", "operator-made-1", datetime.now(UTC))
        org_id = org.id
    assert mail_api.post(f"{API}/password/forgot", json={"email": "made@example.com"}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    assert mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "fresh-password-1"}).status_code == 200  # fmt: skip
    login = mail_api.post(f"{API}/login", json={"email": "made@example.com", "password": "fresh-password-1"}).json()
    me = mail_api.get(f"{API}/me", headers=bearer(login["token"])).json()
    assert (me["email_verified"], me["trial_pending"]) == (True, False)
    assert mail_api.get(f"{API}/orgs/{org_id}/balance", headers=bearer(login["token"])).json()["exact"] == "0.00000000"


def test_a_link_expires_and_loses_to_a_newer_password(mail_api: TestClient, inbox: Inbox,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    who = signup(mail_api, "late@example.com")
    for _ in range(2):
        assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    first, second = _reset_tokens(inbox, 2)
    later = datetime.now(UTC) + password_resets.TOKEN_TTL + timedelta(seconds=1)
    monkeypatch.setattr("suanli.api.routers.passwords.utcnow", lambda: later)
    r = mail_api.post(f"{API}/password/reset", json={"token": first, "new_password": "fresh-password-1"})
    assert r.status_code == 422 and "expired" in r.json()["detail"], r.text
    monkeypatch.undo()
    assert _change(mail_api, who.token, "tenant-password", "changed-password-1").status_code == 200
    r = mail_api.post(f"{API}/password/reset", json={"token": second, "new_password": "thief-password-1"})
    assert r.status_code == 409, r.text  # the change spent the links still out
    assert _login(mail_api, who.email, "changed-password-1") == 200


@pytest.mark.parametrize(
    "token", ["", "garbage", "a" * 43, "x" * 129, "../../etc/passwd", "a b c d e f g h i j k l m n"]
)
def test_garbage_tokens_are_refused_naming_the_token(mail_api: TestClient, token: str) -> None:
    r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "fresh-password-1"})
    assert r.status_code == 422 and "token" in r.text, r.text


def test_a_short_new_password_does_not_spend_the_link(mail_api: TestClient, inbox: Inbox) -> None:
    who = signup(mail_api, "brief@example.com")
    assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "short"})
    assert r.status_code == 422 and r.json()["detail"].startswith("new_password"), r.text
    r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "long-enough-1"})
    assert r.status_code == 200, r.text


def test_eight_redeems_of_one_link_at_once_set_one_password(mail_api: TestClient, inbox: Inbox) -> None:
    who = signup(mail_api, "race@example.com")
    assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    passwords = [f"racer-password-{i}" for i in range(8)]

    def redeem(p: str) -> tuple[str, int]:
        r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": p})
        return p, r.status_code

    results, errors = at_once(*[lambda p=p: redeem(p) for p in passwords])  # type: ignore[misc]
    assert errors == [] and sorted(code for _, code in results) == [200] + [409] * 7, (results, errors)
    winner = next(p for p, code in results if code == 200)
    with mail_api.app.state.server.db.read() as s:  # type: ignore[attr-defined]
        stored = accounts.password_hash_of(s, who.email)  # not by logging in 8 times: that is throttled
    assert [p for p in passwords if accounts.verify_password(stored, p)] == [winner]


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIInjAvsHnPEnhIT3CLfoR5qjDsvDKUqxWjtshpF4K1Wi thief@laptop"


def _proxy_session(api: TestClient, who: Tenant, n: int) -> str:
    """A JupyterLab cookie of the user's into a workload of theirs, as the instance proxy stores it."""
    now, wid, cookie = datetime.now(UTC), f"wl_box{n}", token_hash(f"cookie-{n}-{who.user_id}")
    with api.app.state.server.db.write() as s, s.begin():  # type: ignore[attr-defined]
        s.add(Workload(id=wid, org_id=who.org_id, user_id=who.user_id, name=f"box{n}", kind="instance",
                       spec={"name": f"box{n}", "kind": "instance"}, state="running", created_at=now,
                       submitted_at=now, queued_at=now))  # fmt: skip
        s.flush()
        s.add(ProxySession(id=cookie, kind="session", user_id=who.user_id, workload_id=wid, target="lab",
                           created_at=now, expires_at=now + timedelta(hours=12)))  # fmt: skip
    return cookie


def _has_proxy_session(api: TestClient, key: str) -> bool:
    with api.app.state.server.db.read() as s:  # type: ignore[attr-defined]
        return s.get(ProxySession, key) is not None


def test_a_reset_removes_what_a_squatter_left_and_a_change_ends_proxy_sessions(mail_api: TestClient,
                                                                              inbox: Inbox) -> None:  # fmt: skip
    """Someone signs up first with another's address (no verification is needed to add an SSH key) and opens
    JupyterLab; the address's owner takes the account back by mail: the key and the cookie go with the old
    password. A change (the owner knows the password and sees their keys on the same page) keeps the keys."""
    squatter = signup(mail_api, "owner@example.com")
    assert (
        mail_api.post(
            f"{API}/keys", json={"password": "tenant-password", "public_key": KEY}, headers=squatter.headers
        ).status_code
        == 201
    )
    cookie = _proxy_session(mail_api, squatter, 1)
    assert _change(mail_api, squatter.token, "tenant-password", "squatter-password-2").status_code == 200
    assert not _has_proxy_session(mail_api, cookie)  # a change ends proxy sessions
    cookie = _proxy_session(mail_api, squatter, 2)
    assert len(mail_api.get(f"{API}/keys", headers=squatter.headers).json()) == 1  # and keeps the keys
    assert mail_api.post(f"{API}/password/forgot", json={"email": "owner@example.com"}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "owner-password-1"})
    assert r.status_code == 200 and r.json()["removed_ssh_keys"] == 1, r.text
    assert not _has_proxy_session(mail_api, cookie) and not _works(mail_api, squatter.token)
    owner = mail_api.post(f"{API}/login", json={"email": "owner@example.com", "password": "owner-password-1"})
    assert mail_api.get(f"{API}/keys", headers=bearer(owner.json()["token"])).json() == []


def test_a_change_in_flight_never_undoes_a_reset(mail_api: TestClient, inbox: Inbox,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A thief who knows the password keeps changing it; the owner resets by mail while one change is between
    its check of the current password and its write. The reset wins: the change finds another password set
    meanwhile (409) and the owner's new session stays. With the reset held open after it spent the link, the change
    waits its turn on PostgreSQL rather than deadlocking (503)."""
    who = signup(mail_api, "contested@example.com")
    thief = mail_api.post(f"{API}/login", json={"email": who.email, "password": "tenant-password"}).json()["token"]
    checked, go = threading.Event(), threading.Event()
    real_finish = routes._finish_change

    def held_finish(*args: Any) -> Any:
        checked.set()
        assert go.wait(30)
        return real_finish(*args)

    monkeypatch.setattr(routes, "_finish_change", held_finish)
    change: list[Any] = []
    t = threading.Thread(target=lambda: change.append(_change(mail_api, thief, "tenant-password", "thief-password-1")))
    t.start()
    assert checked.wait(30)
    assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "owner-password-1"})
    assert r.status_code == 200, r.text
    owner = mail_api.post(f"{API}/login", json={"email": who.email, "password": "owner-password-1"}).json()["token"]
    go.set()
    t.join(30)
    assert change[0].status_code in (401, 409), change[0].text
    assert _login(mail_api, who.email, "owner-password-1") == 200 and _works(mail_api, owner)
    assert _login(mail_api, who.email, "thief-password-1") == 401


def test_a_reset_held_open_makes_a_change_wait_not_deadlock(mail_api: TestClient, inbox: Inbox,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    who = signup(mail_api, "turns@example.com")
    assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    spent, go = threading.Event(), threading.Event()
    real_redeem = password_resets.redeem

    def held_redeem(s: Any, tok: str, now: Any) -> Any:
        user = real_redeem(s, tok, now)
        spent.set()
        go.wait(3)  # the change starts meanwhile, and must wait for this transaction, not deadlock with it
        return user

    monkeypatch.setattr(password_resets, "redeem", held_redeem)
    reset: list[Any] = []
    t = threading.Thread(target=lambda: reset.append(mail_api.post(
        f"{API}/password/reset", json={"token": token, "new_password": "owner-password-1"})))  # fmt: skip
    t.start()
    assert spent.wait(30)
    timer = threading.Timer(1.0, go.set)
    timer.start()
    change = _change(mail_api, who.token, "tenant-password", "changed-password-1")
    t.join(30)
    assert reset[0].status_code == 200, reset[0].text
    assert change.status_code in (401, 409, 422), change.text  # after the reset: its session or its password is gone
    assert _login(mail_api, who.email, "owner-password-1") == 200


def test_a_login_in_flight_never_outlives_a_reset(mail_api: TestClient, inbox: Inbox,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A thief logging in with the old password in a loop always has one login between its password check and its
    token: the reset lands there; the login then finds another password stored and is refused."""
    who = signup(mail_api, "looped@example.com")
    checked, go = threading.Event(), threading.Event()
    real_finish = auth_routes._finish_login

    def held_finish(*args: Any) -> Any:
        checked.set()
        assert go.wait(30)
        return real_finish(*args)

    monkeypatch.setattr(auth_routes, "_finish_login", held_finish)
    login: list[Any] = []
    t = threading.Thread(target=lambda: login.append(mail_api.post(
        f"{API}/login", json={"email": who.email, "password": "tenant-password"})))  # fmt: skip
    t.start()
    assert checked.wait(30)
    monkeypatch.setattr(auth_routes, "_finish_login", real_finish)
    assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
    (token,) = _reset_tokens(inbox, 1)
    r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "owner-password-1"})
    assert r.status_code == 200, r.text
    go.set()
    t.join(30)
    assert login[0].status_code == 401, login[0].text
    assert _login(mail_api, who.email, "owner-password-1") == 200


def test_a_token_another_process_still_trusts_makes_no_credential_after_a_reset(
    mail_api: TestClient, inbox: Inbox, db_url: str, tmp_path: Any
) -> None:
    """Each server process trusts a token it checked for 5 s; on a second process over the same database the
    thief's token, revoked by the owner's reset on the first, must not make an SSH key, a token or an endpoint key
    that outlives the reset."""
    who = signup(mail_api, "two-workers@example.com")
    with TestClient(
        create_app(settings(tmp_path / "home2", db_url, smtp_url=inbox.url, public_url=SITE)), base_url=BROWSER
    ) as other:
        assert other.get(f"{API}/me", headers=who.headers).status_code == 200  # now cached there
        assert mail_api.post(f"{API}/password/forgot", json={"email": who.email}).status_code == 202
        (token,) = _reset_tokens(inbox, 1)
        r = mail_api.post(f"{API}/password/reset", json={"token": token, "new_password": "owner-password-1"})
        assert r.status_code == 200, r.text
        assert (
            other.post(
                f"{API}/keys", json={"password": "tenant-password", "public_key": KEY}, headers=who.headers
            ).status_code
            == 401
        )
        assert other.post(f"{API}/tokens", json={"name": "back"}, headers=who.headers).status_code == 401
    owner = mail_api.post(f"{API}/login", json={"email": who.email, "password": "owner-password-1"}).json()["token"]
    assert mail_api.get(f"{API}/keys", headers=bearer(owner)).json() == []
    assert [t["name"] for t in mail_api.get(f"{API}/tokens", headers=bearer(owner)).json() if not t["revoked_at"]] == [
        "login"
    ]


def test_concurrent_logins_never_fail_with_a_500(api: TestClient) -> None:
    """Logins sweep forgotten throttle buckets; a sweep used to delete another login's bucket between its insert
    and its lock, and that login failed with a KeyError (500) on PostgreSQL; locks taken out of key order, and a
    retry of the insert, then deadlocked (503)."""
    signup(api, "busy@example.com")
    for _ in range(5):
        results, errors = at_once(*[lambda: _login(api, "busy@example.com", "tenant-password") for _ in range(4)])
        assert errors == [] and all(code in (200, 429) for code in results), (results, errors)
        time.sleep(0.05)
