"""A token cannot make one that outlives it without the password: a stolen day-long console cookie, or a week's CI
token, is not a way to a credential that never expires.

The attack: whoever holds a token for a day (a console session, a short CI token) asks `POST /tokens` for one with no
expiry, and keeps the account after the day is over and after the victim revokes what they know of. Now a new token
that would expire later than the caller's (or never, while the caller's does) needs the account's `password`, checked
like a login (a wrong one is counted by the login throttle). Both databases (`api`).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.control_plane import bearer, signup

API = "/api/v1"
PASSWORD = "tenant-password"  # `signup`'s


def _short(api: Any, headers: dict[str, str]) -> dict[str, Any]:
    r = api.post(f"{API}/tokens", json={"name": "a day", "expires_in_days": 1}, headers=headers)
    assert r.status_code == 201, r.text  # shorter than the 30-day login that makes it: no password asked
    return dict(r.json())


@pytest.mark.parametrize("days", [None, 30, 1])
def test_a_token_cannot_make_one_that_outlives_it_without_the_password(api: Any, days: int | None) -> None:
    t = signup(api, "owner@example.com")
    short = _short(api, t.headers)
    r = api.post(f"{API}/tokens", json={"name": "forever", "expires_in_days": days}, headers=bearer(short["token"]))
    assert r.status_code == 403, r.text
    assert r.json()["detail"].startswith("password:"), r.text
    names = [x["name"] for x in api.get(f"{API}/tokens", headers=t.headers).json()]
    assert "forever" not in names


def test_a_wrong_password_is_refused_naming_it(api: Any) -> None:
    t = signup(api, "wrong@example.com")
    short = _short(api, t.headers)
    r = api.post(f"{API}/tokens", json={"name": "forever", "password": "not-it"}, headers=bearer(short["token"]))
    assert r.status_code == 422 and r.json()["detail"] == "password: wrong password", r.text


def test_the_password_lets_it_make_a_longer_lived_token(api: Any) -> None:
    t = signup(api, "right@example.com")
    short = _short(api, t.headers)
    r = api.post(f"{API}/tokens", json={"name": "forever", "password": PASSWORD}, headers=bearer(short["token"]))
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["expires_at"] is None and api.get(f"{API}/me", headers=bearer(made["token"])).status_code == 200


def test_a_token_that_never_expires_and_a_shorter_token_need_no_password(api: Any) -> None:
    t = signup(api, "free@example.com")
    forever = api.post(f"{API}/tokens", json={"name": "forever", "password": PASSWORD}, headers=t.headers).json()
    r = api.post(f"{API}/tokens", json={"name": "another"}, headers=bearer(forever["token"]))
    assert r.status_code == 201, r.text
    r = api.post(f"{API}/tokens", json={"name": "a week", "expires_in_days": 7}, headers=t.headers)
    assert r.status_code == 201, r.text


def test_wrong_passwords_here_are_throttled_like_logins(api: Any) -> None:
    t = signup(api, "guess@example.com")
    codes = [api.post(f"{API}/tokens", json={"name": "x", "password": f"guess-{i}"}, headers=t.headers).status_code
             for i in range(12)]  # fmt: skip
    assert codes[0] == 422 and codes[-1] == 429, codes


@pytest.mark.parametrize("password", ["", "x" * 1025, 5, None])
def test_a_malformed_password_is_refused_naming_it(api: Any, password: object) -> None:
    t = signup(api, "bad@example.com")
    r = api.post(f"{API}/tokens", json={"name": "x", "password": password}, headers=t.headers)
    if password is None:  # the same as leaving it out: a 30-day login may not make a token that never expires
        assert r.status_code == 403 and r.json()["detail"].startswith("password:"), r.text
    else:
        assert r.status_code == 422 and r.json()["detail"].startswith("password"), r.text


def test_a_password_changed_while_the_old_one_is_checked_makes_no_token(api: Any, monkeypatch: Any) -> None:
    """A hostile review's race: a thief holding the victim's console session and the old password asks for a token
    that never expires; the victim changes the password (keeping that session) while the old one is checked. The
    hash it matched is no longer the account's when the token would be written: 409, no token."""
    from suanli.control.accounts import accounts, password_resets
    from suanli.control.ids import utcnow

    victim = signup(api, "raced@example.com")
    session = _short(api, victim.headers)
    srv = api.app.state.server
    real = accounts.verify_password

    def check_then_victim_changes(stored: str | None, password: str) -> bool:
        ok = real(stored, password)
        with srv.db.write() as s, s.begin():
            password_resets.set_password(s, victim.user_id, accounts.hash_password("victims-new-pw"), utcnow(),
                                         keep_token_id=session["id"])  # fmt: skip
        return ok

    monkeypatch.setattr(accounts, "verify_password", check_then_victim_changes)
    r = api.post(f"{API}/tokens", json={"name": "forever", "password": PASSWORD}, headers=bearer(session["token"]))
    monkeypatch.setattr(accounts, "verify_password", real)
    assert r.status_code == 409 and r.json()["detail"].startswith("password:"), r.text
    names = [t["name"] for t in api.get(f"{API}/tokens", headers=bearer(session["token"])).json()]
    assert "forever" not in names
