"""Post/Redirect/Get for the forms that make a secret (an API token, an invitation's code, an endpoint key, a batch
of top-up codes): the POST answers 303, the next GET shows the secret once, a reload does not, and another session
presenting the same one-time id gets nothing. Attack: a reload (or the back button) after the answer that showed
the secret posted the form again and made a second secret; a session that learnt the id must not read it."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from suanli.control.accounts import console_secrets
from suanli.control.ids import utcnow
from suanli.db.engine import DatabaseUnavailable
from suanli.db.models import ConsoleSecret
from suanli.web import once
from suanli.web.once import ONCE_COOKIE
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, bearer
from tests.test_web_endpoints import EP, _owner, platform  # noqa: F401  (platform: the fixture)
from tests.test_workloads_api import Platform
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

EN = {"Accept-Language": "en"}
PW = "tenant-password"  # `Console.signup`'s: a console key outlives the day-long session (POST /tokens asks it)


def _console(api: Any, email: str) -> Console:
    c = Console(type(api)(api.app))
    c.signup(email)
    return c


def _shown_once(owner: Console, other: Console, post: str, form: dict[str, str], where: str, secret_re: str) -> str:
    """POST the form; 303 to `where` with the one-time id in an HttpOnly, SameSite=Lax cookie and no secret in the
    answer; `other` presenting the id gets nothing (and takes nothing); the owner's next GET shows the secret,
    the one after it does not. The secret."""
    r = owner.post(post, form, csrf_from=where, headers=EN)
    assert r.status_code == 303, r.text[-600:]
    assert r.headers["location"] == where
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{ONCE_COOKIE}=") and "HttpOnly" in cookie and "samesite=lax" in cookie.lower()
    assert "Max-Age=300" in cookie  # short-lived: the entry behind it expires then too
    key = owner.c.cookies.get(ONCE_COOKIE)
    assert key and not re.search(secret_re, r.text, re.S)
    other.c.cookies.set(ONCE_COOKIE, key)
    stolen = other.get(where, headers=EN)
    assert stolen.status_code in (200, 404) and not re.search(secret_re, stolen.text, re.S)
    first = owner.get(where, headers=EN)
    assert first.status_code == 200
    m = re.search(secret_re, first.text, re.S)
    assert m, first.text[-1500:]
    assert 'id="once-lost"' not in first.text
    assert m.group(1) not in (first.headers.get("set-cookie") or "")  # never in a cookie
    again = owner.get(where, headers=EN)
    assert again.status_code == 200 and m.group(1) not in again.text and 'id="once-lost"' not in again.text
    return m.group(1)


def _tokens(c: Console) -> list[str]:
    token = c.c.cookies.get("suanli_session")
    return [t["name"] for t in c.c.get("/api/v1/tokens", headers=bearer(token)).json() if not t["revoked_at"]]


def test_a_new_token_is_shown_once_after_a_redirect(api: Any) -> None:
    owner, other = _console(api, "prg-tok@example.com"), _console(api, "prg-thief@example.com")
    secret = _shown_once(owner, other, "/keys/tokens", {"name": "ci", "expires_in_days": "30", "password": PW}, "/keys",
                         r'id="token-secret">([^<]+)<')  # fmt: skip
    assert api.get("/api/v1/me", headers=bearer(secret)).status_code == 200
    assert sorted(_tokens(owner)) == ["ci", "web console"]  # the reloads made no second token


def test_an_invitation_code_is_shown_once_after_a_redirect(api: Any) -> None:
    owner, other = _console(api, "prg-owner@example.com"), _console(api, "prg-other@example.com")
    assert owner.post("/team/orgs", {"name": "prg-lab"}, csrf_from="/team").status_code == 303
    _shown_once(owner, other, "/team/invitations", {"email": "friend@example.com", "role": "member"}, "/team",
                r'id="new-invitation">.*?<code>([^<]+)</code>')  # fmt: skip
    assert "friend@example.com" in owner.get("/team").text


def test_an_endpoint_key_is_shown_once_after_a_redirect(platform: Platform) -> None:  # noqa: F811
    owner, ep = _owner(platform)
    other = _console(platform.api, "prg-ep-thief@example.com")
    where = f"/endpoints/{ep['id']}"
    _shown_once(owner, other, f"{where}/keys", {"name": "app", "password": PW}, where, r'id="key-secret">([^<]+)<')
    assert len(platform.api.get(f"{EP}/{ep['id']}/keys", headers=platform.tenant.headers).json()) == 1


def test_top_up_codes_are_printed_once_after_a_redirect(api: Any) -> None:
    ops = Console(type(api)(api.app))
    ops.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    other = _console(api, "prg-codes@example.com")  # not an operator: a 403 page, never the sheet
    r = ops.post("/ops/codes", {"amount": "5.00", "count": "2", "note": "prg"}, csrf_from="/ops/codes")
    assert r.status_code == 303 and r.headers["location"].startswith("/ops/codes/")
    where, key = r.headers["location"], ops.c.cookies.get(ONCE_COOKIE)
    assert "<code" not in r.text
    other.c.cookies.set(ONCE_COOKIE, key)
    assert '<code class="code">' not in other.get(where).text
    other_admin = Console(type(api)(api.app))
    other_admin.login(ADMIN_EMAIL, ADMIN_PASSWORD)  # another session of the same operator: not the one that made it
    other_admin.c.cookies.set(ONCE_COOKIE, key)
    assert '<code class="code">' not in other_admin.get(where).text
    sheet = ops.get(where, headers=EN)
    assert sheet.status_code == 200 and len(re.findall(r'<code class="code">([^<]+)</code>', sheet.text)) == 2
    again = ops.get(where, headers=EN)
    assert again.status_code == 200 and '<code class="code">' not in again.text and 'id="redeemed"' in again.text
    assert len(api.get("/api/v1/admin/topup-codes", headers=ops_headers(ops)).json()) == 1


def ops_headers(c: Console) -> dict[str, str]:
    return bearer(c.c.cookies.get("suanli_session"))


def test_a_failed_form_still_shows_its_fields_and_sets_no_once_cookie(api: Any) -> None:
    c = _console(api, "prg-bad@example.com")
    r = c.post("/keys/tokens", {"name": "", "expires_in_days": "3", "password": PW}, csrf_from="/keys")
    assert r.status_code == 422 and 'class="field-error"' in r.text and 'id="token-form"' in r.text
    assert ONCE_COOKIE not in (r.headers.get("set-cookie") or "")


def test_htmx_is_sent_on_with_hx_redirect(api: Any) -> None:
    c = _console(api, "prg-htmx@example.com")
    r = c.post("/keys/tokens", {"name": "hx", "password": PW}, csrf_from="/keys", headers={"HX-Request": "true"})
    assert r.status_code == 204 and r.headers["HX-Redirect"] == "/keys"
    assert 'id="token-secret">' in c.get("/keys").text


def test_two_tabs_making_secrets_before_either_page_shows_each_get_theirs(api: Any) -> None:
    """An invitation and two tokens made before any of their pages is shown (tabs): each page shows the oldest
    secret waiting for it, once; none is lost or shown twice."""
    c = _console(api, "prg-tabs@example.com")
    assert c.post("/team/orgs", {"name": "tabs-lab"}, csrf_from="/team").status_code == 303
    # The forms' CSRF token is read off a page that shows no secret (a signed-in session's is the same everywhere).
    invited = c.post("/team/invitations", {"email": "tab@example.com", "role": "member"}, csrf_from="/")
    assert invited.status_code == 303, invited.text[-600:]
    for name in ("tab one", "tab two"):
        assert (
            c.post("/keys/tokens", {"name": name, "expires_in_days": "30", "password": PW}, csrf_from="/").status_code
            == 303
        )
    secret = r'id="token-secret">([^<]+)<'
    shown = []
    for _ in range(2):
        page = c.get("/keys", headers=EN).text
        m = re.search(secret, page)
        assert m and 'id="once-lost"' not in page, page[-1500:]
        shown.append(m.group(1))
    after = c.get("/keys", headers=EN).text
    assert not re.search(secret, after) and 'id="once-lost"' not in after
    assert shown[0] != shown[1] and all(api.get("/api/v1/me", headers=bearer(t)).status_code == 200 for t in shown)
    invite = c.get("/team", headers=EN).text  # the invitation waited for its own page
    assert 'id="once-lost"' not in invite and re.search(r'id="new-invitation">.*?<code>([^<]+)</code>', invite, re.S)
    assert c.c.cookies.get(ONCE_COOKIE) is None
    assert sorted(_tokens(c)) == ["tab one", "tab two", "web console"]


def test_a_restart_between_post_and_get_still_shows_the_secret(api: Any, db_url: str, tmp_path: Any) -> None:
    """The secret waits in the database, not in the process: a server restarted between the POST and the GET (a
    fresh app on the same database) shows it."""
    from fastapi.testclient import TestClient

    from suanli.api.app import create_app
    from tests.control_plane import settings

    c = _console(api, "prg-restart@example.com")
    assert c.post("/keys/tokens", {"name": "kept", "password": PW}, csrf_from="/keys").status_code == 303
    with TestClient(create_app(settings(tmp_path / "home", db_url))) as restarted:
        again = Console(restarted)
        for name, value in c.c.cookies.items():
            again.c.cookies.set(name, value)
        page = again.get("/keys", headers=EN).text
        assert 'id="token-secret"' in page and 'id="once-lost"' not in page


def test_an_expired_secret_is_said_lost_once(api: Any) -> None:
    c = _console(api, "prg-expired@example.com")
    assert c.post("/keys/tokens", {"name": "gone", "password": PW}, csrf_from="/keys").status_code == 303
    db = api.app.state.server.db
    with db.write() as s, s.begin():
        s.execute(update(ConsoleSecret).values(expires_at=utcnow() - timedelta(seconds=1)))
    page = c.get("/keys", headers=EN).text
    assert 'id="once-lost"' in page and 'id="token-secret"' not in page
    assert 'id="once-lost"' not in c.get("/keys", headers=EN).text  # said once; the cookie is gone


def test_the_database_holds_no_readable_secret_and_the_key_alone_shows_nothing(api: Any) -> None:
    """Attack: a copy of the database taken while a secret waits. Its row holds neither the secret nor the key that
    opens it (only the key's hash), and is bound to the session that made it."""
    c = _console(api, "prg-dump@example.com")
    assert c.post("/keys/tokens", {"name": "dump", "password": PW}, csrf_from="/keys").status_code == 303
    key = c.c.cookies.get(ONCE_COOKIE)
    db = api.app.state.server.db
    with db.read() as s:
        rows = list(s.scalars(select(ConsoleSecret)))
    assert len(rows) == 1
    row = rows[0]
    assert key not in (row.id, row.owner) and key.encode() not in bytes(row.sealed)
    assert row.owner == console_secrets.owner_of(c.c.cookies.get("suanli_session"))
    secret = re.search(r'id="token-secret">([^<]+)<', c.get("/keys", headers=EN).text)
    assert secret and secret.group(1).encode() not in bytes(row.sealed)
    with db.read() as s:
        assert console_secrets.count(s) == 0  # taken: the row is gone


@pytest.mark.parametrize("junk", ["x" * 200, "no such id"])
def test_a_junk_once_cookie_is_no_secret_and_no_500(api: Any, junk: str) -> None:
    c = _console(api, "prg-junk@example.com")
    c.c.cookies.set(ONCE_COOKIE, junk)
    r = c.get("/keys", headers=EN)
    assert r.status_code == 200 and 'id="token-secret"' not in r.text


def test_another_session_presenting_a_cookie_of_several_ids_takes_none_of_them(api: Any) -> None:
    """A thief's copy of the owner's cookie (two ids, junk and an overlong id mixed in) shows nothing and takes
    nothing: the owner still sees both secrets, one per visit."""
    owner, thief = _console(api, "prg-many@example.com"), _console(api, "prg-many-thief@example.com")
    for name in ("one", "two"):
        assert owner.post("/keys/tokens", {"name": name, "password": PW}, csrf_from="/").status_code == 303
    ids = owner.c.cookies.get(ONCE_COOKIE)
    assert ids and len(ids.split(".")) == 2
    thief.c.cookies.set(ONCE_COOKIE, f"junk!.{'x' * 200}.{ids}")
    stolen = thief.get("/keys", headers=EN).text
    assert 'id="token-secret"' not in stolen
    shown = [re.search(r'id="token-secret">([^<]+)<', owner.get("/keys", headers=EN).text) for _ in range(2)]
    assert all(shown) and shown[0].group(1) != shown[1].group(1)  # type: ignore[union-attr]


def test_a_secret_made_in_one_server_process_is_shown_by_another(api: Any, db_url: str, tmp_path: Any) -> None:
    """`suanli server --workers N`: the POST that made a token and the GET its redirect leads to may be answered by
    two processes of one database. The second shows the secret, once; a reload on either shows nothing."""
    from fastapi.testclient import TestClient

    from suanli.api.app import create_app
    from tests.control_plane import settings

    c = _console(api, "prg-workers@example.com")
    assert (
        c.post("/keys/tokens", {"name": "w2", "expires_in_days": "30", "password": PW}, csrf_from="/keys").status_code
        == 303
    )
    with TestClient(create_app(settings(tmp_path / "home", db_url))) as other_process:
        other = Console(other_process)
        for name, value in c.c.cookies.items():
            other.c.cookies.set(name, value)
        page = other.get("/keys", headers=EN).text
        m = re.search(r'id="token-secret">([^<]+)<', page)
        assert m and 'id="once-lost"' not in page, page[-1500:]
        assert api.get("/api/v1/me", headers=bearer(m.group(1))).status_code == 200
        assert 'id="token-secret"' not in other.get("/keys", headers=EN).text
    c.c.cookies.set(ONCE_COOKIE, other.c.cookies.get(ONCE_COOKIE) or "")
    assert 'id="token-secret"' not in c.get("/keys", headers=EN).text  # the first process took nothing either


def test_a_secret_the_database_cannot_hold_is_shown_in_the_answer_not_lost(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """Attack (on availability): the API made the token, then the database could not hold it for the next page.
    A brief outage is retried; a longer one answers with the page and the secret in it (no cookie: a reload would
    post the form again, a smaller harm than a token nobody can see)."""
    real, calls = console_secrets.hold, []

    def fails(times: int) -> Any:
        def hold(*a: Any, **kw: Any) -> str:
            calls.append(1)
            if len(calls) <= times:
                raise DatabaseUnavailable("the database did not answer in time")
            return real(*a, **kw)

        return hold

    c = _console(api, "prg-outage@example.com")
    monkeypatch.setattr(console_secrets, "hold", fails(1))
    assert c.post("/keys/tokens", {"name": "retried", "password": PW}, csrf_from="/keys").status_code == 303
    assert len(calls) == 2 and 'id="token-secret"' in c.get("/keys", headers=EN).text
    calls.clear()
    monkeypatch.setattr(console_secrets, "hold", fails(99))
    r = c.post("/keys/tokens", {"name": "shown-now", "password": PW}, csrf_from="/keys", headers=EN)
    assert r.status_code == 200 and len(calls) == len(once.HOLD_WAITS_S), r.text[-600:]
    m = re.search(r'id="token-secret">([^<]+)<', r.text)
    assert m and api.get("/api/v1/me", headers=bearer(m.group(1))).status_code == 200
    assert r.headers["cache-control"] == "no-store" and ONCE_COOKIE not in (r.headers.get("set-cookie") or "")
    assert sorted(_tokens(c)) == ["retried", "shown-now", "web console"]
    thief = _console(api, "prg-outage-thief@example.com")  # another session sees none of it, then or later
    for who in (thief, c):
        assert m.group(1) not in who.get("/keys", headers=EN).text


def test_a_hold_that_fails_for_good_reason_is_not_retried(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (not an outage) is not retried and not hidden: it is raised (a 500, and the log says why)."""
    calls = []

    def broken(*a: Any, **kw: Any) -> str:
        calls.append(1)
        raise ValueError("a bug")

    c = _console(api, "prg-bug@example.com")
    monkeypatch.setattr(console_secrets, "hold", broken)
    with pytest.raises(ValueError):
        c.post("/keys/tokens", {"name": "bug", "password": PW}, csrf_from="/keys")
    assert len(calls) == 1


def _held_by_no_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(*a: Any, **kw: Any) -> str:
        raise DatabaseUnavailable("the database did not answer in time")

    monkeypatch.setattr(console_secrets, "hold", down)
    monkeypatch.setattr(once, "HOLD_WAITS_S", (0.0,))


def test_an_invitation_and_top_up_codes_the_database_cannot_hold_are_shown_in_the_answer(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    owner = _console(api, "prg-outage-team@example.com")
    assert owner.post("/team/orgs", {"name": "outage-lab"}, csrf_from="/team").status_code == 303
    ops = Console(type(api)(api.app))
    ops.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    _held_by_no_one(monkeypatch)
    r = owner.post("/team/invitations", {"email": "late@example.com", "role": "member"}, csrf_from="/team")
    assert r.status_code == 200 and re.search(r'id="new-invitation">.*?<code>([^<]+)</code>', r.text, re.S)
    r = ops.post("/ops/codes", {"amount": "5.00", "count": "3", "note": "outage"}, csrf_from="/ops/codes")
    assert r.status_code == 200 and len(re.findall(r'<code class="code">([^<]+)</code>', r.text)) == 3


def test_an_endpoint_key_the_database_cannot_hold_is_shown_in_the_answer(
    platform: Platform,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, ep = _owner(platform)
    _held_by_no_one(monkeypatch)
    r = owner.post(f"/endpoints/{ep['id']}/keys", {"name": "app", "password": PW}, csrf_from=f"/endpoints/{ep['id']}")
    assert r.status_code == 200 and re.search(r'id="key-secret">([^<]+)<', r.text), r.text[-600:]
