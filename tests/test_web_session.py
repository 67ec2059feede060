"""The console's sessions: cookie flags, CSRF on every form, logout, expiry, language, and no open redirect.

In-process on SQLite and PostgreSQL (the `api` fixture); each attack is a request a hostile page could make."""

from __future__ import annotations

from typing import Any

from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, bearer
from tests.web_helpers import Console, csrf_of, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)


def test_pages_need_a_session_and_send_the_browser_to_login(api: Any) -> None:
    r = api.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2F"
    r = api.get("/_/dashboard", headers={"HX-Request": "true"}, follow_redirects=False)
    assert r.headers.get("HX-Redirect", "").startswith("/login")


def test_signup_sets_an_httponly_samesite_cookie_and_shows_the_trial_credit(api: Any) -> None:
    c = Console(api)
    page = c.get("/signup")
    r = c.c.post("/signup", data={"csrf": csrf_of(page.text), "email": "web@example.com", "password": "pw-123456"},
                 follow_redirects=False)  # fmt: skip
    assert r.status_code == 303, r.text
    cookie = next(v for k, v in r.headers.multi_items() if k == "set-cookie" and v.startswith("suanli_session="))
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie and "Max-Age=86400" in cookie
    home = c.get("/", headers={"Accept-Language": "en"})
    assert home.status_code == 200 and "¥10.00" in home.text and "web@example.com" in home.text


def test_a_form_without_its_csrf_token_is_refused_and_nothing_happens(api: Any) -> None:
    c = Console(api)
    c.get("/signup")  # the double-submit cookie exists, but the form does not repeat it
    r = c.c.post("/signup", data={"email": "csrf@example.com", "password": "pw-123456"}, follow_redirects=False)
    assert r.status_code == 403
    r = c.c.post("/signup", data={"csrf": "forged", "email": "csrf@example.com", "password": "pw-123456"},
                 follow_redirects=False)  # fmt: skip
    assert r.status_code == 403
    # the account was not made: the API signs the address up now, as the first time
    assert api.post("/api/v1/signup", json={"email": "csrf@example.com", "password": "pw-123456"}).status_code == 201
    c.signup("victim@example.com")
    for path, data in (("/logout", {}), ("/lang", {"lang": "en"}), ("/org", {"org": "x"})):
        assert c.c.post(path, data=data, follow_redirects=False).status_code == 403, path
        wrong = {"csrf": "0" * 40, **data}
        assert c.c.post(path, data=wrong, follow_redirects=False).status_code == 403, path
    assert c.get("/").status_code == 200  # still signed in: the forged logout did nothing


def test_logout_revokes_the_session_token_at_the_api(api: Any) -> None:
    c = Console(api)
    c.signup("out@example.com")
    token = api.cookies.get("suanli_session")
    assert api.get("/api/v1/me", headers=bearer(token)).status_code == 200
    assert c.post("/logout").status_code == 303
    assert api.get("/api/v1/me", headers=bearer(token)).status_code == 401
    api.cookies.set("suanli_session", token)  # a stolen copy of the cookie is worth nothing now
    assert c.get("/").status_code == 303


def test_the_session_is_its_own_one_day_token_and_the_login_token_is_revoked(api: Any) -> None:
    c = Console(api)
    c.signup("tok@example.com")
    token = api.cookies.get("suanli_session")
    tokens = api.get("/api/v1/tokens", headers=bearer(token)).json()
    live = [t for t in tokens if not t.get("revoked_at")]
    assert [t["name"] for t in live] == ["web console"], tokens
    assert live[0]["expires_at"] is not None


def test_a_login_token_of_one_day_still_opens_a_console_session(db_url: str, tmp_path: Any) -> None:
    """The console trades the login token for its own day-long one, which would outlive a one-day login token by
    the moments between them: the console proves the password it was just given."""
    from fastapi.testclient import TestClient

    from suanli.api.app import create_app
    from tests.control_plane import settings

    with TestClient(create_app(settings(tmp_path / "home", db_url, login_token_days=1))) as client:
        c = Console(client)
        c.signup("day@example.com")
        c.post("/logout")
        c.login("day@example.com", "tenant-password")
        assert c.get("/").status_code == 200


def test_login_never_redirects_off_site(api: Any) -> None:
    c = Console(api)
    c.signup("nx@example.com")
    c.post("/logout")
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)"):
        r = c.post("/login", {"email": "nx@example.com", "password": "tenant-password", "next": target},
                   csrf_from="/login")  # fmt: skip
        assert r.status_code == 303 and r.headers["location"] == "/", target
        c.post("/logout")
    r = c.post("/login", {"email": "nx@example.com", "password": "tenant-password", "next": "/workloads?all=1"},
               csrf_from="/login")  # fmt: skip
    assert r.headers["location"] == "/workloads?all=1"


def test_a_wrong_password_shows_the_apis_message_and_sets_no_session(api: Any) -> None:
    c = Console(api)
    c.signup("pw@example.com")
    c.post("/logout")
    r = c.post("/login", {"email": "pw@example.com", "password": "wrong"}, csrf_from="/login")
    assert r.status_code == 401 and 'role="alert"' in r.text
    assert "suanli_session=" not in r.headers.get("set-cookie", "")


def test_language_follows_accept_language_then_the_switch(api: Any) -> None:
    assert "Log in to suanli" in api.get("/login", headers={"Accept-Language": "en-US,en;q=0.9"}).text
    assert "登录 suanli" in api.get("/login", headers={"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.8"}).text
    assert "登录 suanli" in api.get("/login", headers={"Accept-Language": "fr, de;q=0.5"}).text  # default: Chinese
    c = Console(api)
    c.signup("lang@example.com")
    r = c.post("/lang", {"lang": "en", "next": "/"})
    assert r.status_code == 303
    assert "Dashboard" in c.get("/", headers={"Accept-Language": "zh-CN"}).text


def test_operator_pages_are_refused_to_a_tenant(api: Any) -> None:
    from suanli.web.pages import ROUTERS  # the app's own route list nests included routers (FastAPI 0.165)

    routes = [r for router in ROUTERS for r in router.routes if r.path.startswith("/ops")]
    gets = sorted({r.path for r in routes if "GET" in getattr(r, "methods", ())})
    posts = sorted({r.path for r in routes if "POST" in getattr(r, "methods", ())})
    c = Console(api)
    c.signup("tenant@example.com")
    for path in gets:
        concrete = path.replace("{", "").replace("}", "")
        assert c.get(concrete).status_code == 403, path
    assert "/ops/cluster" in gets and posts
    for path in posts:  # with the tenant's own valid CSRF token: still refused, before anything runs
        concrete = path.replace("{", "").replace("}", "")
        assert c.post(concrete, {"state": "down", "gpu": "0", "kind": "overtemp"}).status_code == 403, path
    admin = Console(type(api)(api.app))
    admin.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    assert "/ops/" in admin.get("/").text  # the operator's menu


def test_api_docs_are_served_from_the_package(api: Any) -> None:
    html = api.get("/docs").text
    assert "cdn" not in html.lower()
    for asset in ("/static/vendor/swagger-ui/swagger-ui-bundle.js", "/static/vendor/swagger-ui/swagger-ui.css"):
        assert asset in html
        assert api.get(asset).status_code == 200
    assert api.get("/redoc").status_code == 404  # not offered: it would need a CDN
    assert '"validatorUrl": null' in html  # and nothing asked of validator.swagger.io on a public host


def test_pages_cannot_be_framed_and_an_api_refusal_is_its_own_status_not_a_500(api: Any) -> None:
    c = Console(api)
    c.signup("frame@example.com")
    for path in ("/", "/login"):
        r = c.get(path)
        assert r.headers["X-Frame-Options"] == "DENY", path
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"], path
        assert "script-src 'self'" in r.headers["Content-Security-Policy"], path
        assert r.headers["X-Content-Type-Options"] == "nosniff", path
    c.c.cookies.set("suanli_org", "org-of-somebody-else")  # not one of the user's: the personal org is used
    assert c.get("/").status_code == 200


def test_every_menu_entry_is_a_page_that_answers(api: Any) -> None:
    """The side menu names every page: each answers 200 to whom it is for (tenant pages also to the operator)."""
    from suanli.web import nav

    c = Console(api)
    c.signup("menu@example.com")
    for href, _, _ in nav.TENANT:
        r = c.get(href, headers={"Accept-Language": "en"})
        assert r.status_code == 200, (href, r.status_code, r.text[:300])
        assert f'href="{href}" class="on"' in r.text, href  # the menu marks where the user is
    admin = Console(type(api)(api.app))
    admin.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    for href, _, _ in nav.TENANT + nav.OPERATOR:
        assert admin.get(href).status_code == 200, href


def test_no_template_has_an_inline_script_or_handler() -> None:
    """The pages' CSP (`script-src 'self'`) runs no inline script: a page that had one would quietly lose it (a
    behaviour a page needs is an attribute console.js acts on: data-confirm, data-print, data-autosubmit)."""
    import re

    from suanli.web.render import TEMPLATES

    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text()
        assert not re.search(r"\son[a-z]+\s*=", text), path
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag or 'type="application/json"' in tag, (path, tag)
