"""A user keeps at most `MAX_LIVE_TOKENS` live tokens (carried over from earlier reviews: a token that expires no
later than the one asking needs no password, so each request was one more row for good). A login or console session
past the bound retires the user's tokens that expire soonest; a token that never expires is refused. Both databases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from suanli.control.accounts import accounts
from suanli.control.ids import utcnow
from suanli.db.models import ApiToken, User
from tests.control_plane import bearer, signup

API = "/api/v1"
PASSWORD = "tenant-password"


def _live(api: Any, user_id: str) -> list[ApiToken]:
    now = utcnow()
    with api.app.state.server.db.read() as s:
        q = select(ApiToken).where(ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None))
        return [t for t in s.scalars(q) if t.expires_at is None or t.expires_at > now]


def _fill(api: Any, user_id: str, n: int, expiring: bool) -> None:
    now = utcnow()
    with api.app.state.server.db.write() as s, s.begin():
        user = s.get(User, user_id)
        for i in range(n):
            accounts.issue_token(s, user, f"t{i}", now, now + timedelta(days=1, minutes=i) if expiring else None)


def test_a_login_past_the_bound_retires_the_session_that_expires_soonest(api: Any) -> None:
    who = signup(api, "busy@example.com", PASSWORD)
    _fill(api, who.user_id, accounts.MAX_LIVE_TOKENS - len(_live(api, who.user_id)), expiring=True)
    soonest = min((t for t in _live(api, who.user_id) if t.expires_at), key=lambda t: t.expires_at)
    r = api.post(f"{API}/login", json={"email": who.email, "password": PASSWORD})
    assert r.status_code == 200, r.text
    live = _live(api, who.user_id)
    assert len(live) == accounts.MAX_LIVE_TOKENS and soonest.id not in {t.id for t in live}
    assert api.get(f"{API}/me", headers=bearer(r.json()["token"])).status_code == 200


def test_a_token_that_never_expires_is_refused_at_the_bound(api: Any) -> None:
    who = signup(api, "keeper@example.com", PASSWORD)
    _fill(api, who.user_id, accounts.MAX_LIVE_TOKENS - len(_live(api, who.user_id)), expiring=False)
    r = api.post(f"{API}/tokens", json={"name": "ci", "password": PASSWORD}, headers=who.headers)
    assert r.status_code == 409 and "live tokens" in r.json()["detail"], r.text
    with api.app.state.server.db.read() as s:
        n = s.scalar(select(func.count()).select_from(ApiToken).where(ApiToken.user_id == who.user_id))
    assert n == accounts.MAX_LIVE_TOKENS
    assert api.get(f"{API}/me", headers=who.headers).status_code == 200  # the session it asked with still works


def test_short_tokens_asked_for_without_end_stay_within_the_bound(api: Any) -> None:
    who = signup(api, "minter@example.com", PASSWORD)
    _fill(api, who.user_id, accounts.MAX_LIVE_TOKENS - 5, expiring=True)
    for i in range(20):  # each expires before the session asking: no password needed
        r = api.post(f"{API}/tokens", json={"name": f"short-{i}", "expires_in_days": 1}, headers=who.headers)
        assert r.status_code == 201, r.text
    assert len(_live(api, who.user_id)) <= accounts.MAX_LIVE_TOKENS
