"""The console under a reviewer's attacks, in-process on SQLite and PostgreSQL: every state-changing route checked
for its CSRF token and every operator route for the operator (walked from the routers, not listed by hand), hostile
names rendered inert, hostile form values answered with 4xx, and session cookies no sibling host can plant."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from suanli.web.pages import ROUTERS
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, admin_token, bearer
from tests.web_helpers import Console, csrf_of, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

XSS = "</script><script>alert(1)</script><img src=x onerror=alert(2)>\"'<!--"


def _routes() -> list[tuple[str, str]]:
    out = []
    for router in ROUTERS:
        for r in router.routes:
            if isinstance(r, APIRoute):
                path = re.sub(r"\{[^}]+\}", "x", r.path)
                out.extend((m, path) for m in sorted(r.methods))
    return out


ROUTES = _routes()


def test_every_state_changing_route_refuses_a_missing_or_wrong_csrf_token(api: Any) -> None:
    c = Console(api)
    c.signup("victim@example.com")
    changing = [(m, p) for m, p in ROUTES if m not in ("GET", "HEAD")]
    assert len(changing) > 25  # the walk found the routes
    for method, path in changing:
        for data in ({}, {"csrf": "0" * 40}):
            r = api.request(method, path, data=data, follow_redirects=False)
            assert r.status_code == 403, (method, path, r.status_code, r.text[:200])
    assert c.get("/").status_code == 200  # still signed in: no forged logout ran


def test_every_operator_route_is_403_to_a_tenant_even_with_its_csrf_token(api: Any) -> None:
    c = Console(api)
    c.signup("tenant@example.com")
    token = csrf_of(c.get("/keys").text)
    ops = [(m, p) for m, p in ROUTES if p.startswith("/ops")]
    assert len(ops) >= 15
    for method, path in ops:
        kw: dict[str, Any] = {} if method == "GET" else {"data": {"csrf": token, "amount": "1", "count": "1"}}
        r = api.request(method, path, follow_redirects=False, **kw)
        assert r.status_code == 403, (method, path, r.status_code)
    batches = api.get("/api/v1/admin/topup-codes", headers=bearer(admin_token(api))).json()
    assert batches == []  # the tenant's POST /ops/codes made nothing


def test_get_routes_change_nothing(api: Any) -> None:
    """SameSite=Lax sends the cookie on another site's top-level GET: no GET may change state."""
    c = Console(api)
    c.signup("get@example.com")
    me = bearer(api.cookies.get("suanli_session"))
    before = (api.get("/api/v1/tokens", headers=me).json(), api.get("/api/v1/me", headers=me).json())
    for method, path in ROUTES:
        if method == "GET" and not path.startswith("/ops"):
            assert api.get(path, follow_redirects=False).status_code < 500, path
    after = (api.get("/api/v1/tokens", headers=me).json(), api.get("/api/v1/me", headers=me).json())
    assert before == after


def test_tenant_strings_are_escaped_on_every_page_they_reach(api: Any) -> None:
    c = Console(api)
    c.signup("xss@example.com")
    csrf = csrf_of(c.get("/keys").text)
    posts = [("/keys/tokens", {"name": XSS[:60], "expires_in_days": "1", "password": "tenant-password"}),
             ("/keys/tokens", {"name": XSS, "expires_in_days": XSS}),
             ("/keys/ssh", {"public_key": XSS, "name": XSS}),
             ("/volumes", {"name": XSS, "size": XSS}),
             ("/team/orgs", {"name": XSS}),
             ("/team/invitations", {"email": XSS, "role": XSS}),
             ("/wallet/redeem", {"code": XSS})]  # fmt: skip
    for path, data in posts:
        r = api.post(path, data={"csrf": csrf, **data}, follow_redirects=False)
        assert r.status_code < 500, (path, r.text[:300])
        assert "<script>alert" not in r.text and "<img src=x" not in r.text, path
    for path in ("/", "/keys", "/team", "/volumes", "/wallet", "/endpoints", "/hub",
                 f"/volumes/{XSS}", f"/endpoints/{XSS}", "/wallet?kind=" + XSS, "/login?next=" + XSS):  # fmt: skip
        r = c.get(path)
        assert r.status_code < 500, path
        assert "<script>alert" not in r.text and "<img src=x" not in r.text, path
        assert 'href="javascript:' not in r.text.lower(), path


@pytest.fixture
def ops(api: Any) -> Console:
    c = Console(api)
    c.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    return c


@pytest.mark.parametrize("value", ["--5", "-\u00b2", "\u00b2", "\u0661\u0662", "1e3", "\x00", "9" * 40, "NaN"])
def test_operator_number_fields_answer_4xx_never_500(api: Any, ops: Console, value: str) -> None:
    """`"--5".lstrip("-")` and `"²"` pass `str.isdigit`, and `int()` then raised: a 500 on the operator's forms."""
    csrf = csrf_of(ops.get("/ops/codes").text)
    r = api.post("/ops/codes", data={"csrf": csrf, "amount": "1", "count": value}, follow_redirects=False)
    assert 400 <= r.status_code < 500, (value, r.status_code, r.text[:300])
    assert "count" in r.text
    org = api.get("/api/v1/me", headers=bearer(admin_token(api))).json()["user"]["personal_org_id"]
    r = api.post(f"/ops/quotas/{org}", data={"csrf": csrf, "gpus": value}, follow_redirects=False)
    assert 400 <= r.status_code < 500, (value, r.status_code, r.text[:300])


@pytest.mark.parametrize("value", ["\u00b2", "\u2460", "\u0661"])
@pytest.mark.parametrize(("path", "form"), [("/run", {"name": "probe", "kind": "job", "command": "true"}),
                                            ("/workloads/wl_0123456789abcdef/scale", {}),
                                            ("/offers/quote", {"model": "llama3.1-8b", "tokens": "1e9"})])  # fmt: skip
def test_tenant_gpu_counts_in_digits_int_cannot_read_answer_4xx_never_500(
    api: Any, path: str, form: dict[str, str], value: str
) -> None:
    """Found by a hostile review: "²" and "①" pass `str.isdigit`, and `int()` then raised: a 500 on three forms."""
    c = Console(api)
    c.signup("digits@example.com")
    csrf = csrf_of(c.get("/run").text)
    r = api.post(path, data={"csrf": csrf, "gpus": value, **form}, follow_redirects=False)
    assert 400 <= r.status_code < 500, (path, value, r.status_code, r.text[:200])


HOSTILE_NEXT = ["/i/wl_0123456789abcdef/auth?ticket=AAAAAAAAAAAAAAAAAAAAAAAA", "/i/wl_0123456789abcdef/lab/",
                "/workloads/../i/wl_0123456789abcdef/auth?ticket=A", "/workloads/%2e%2e/i/wl_0/auth",
                "/workloads/%2E%2E/%2E%2E/i/x", "/api/v1/me", "/\t/evil.example", "/\n/evil.example", "/verify?token=x",
                "/metrics", "//evil.example", "https://evil.example/"]  # fmt: skip


@pytest.mark.parametrize("target", HOSTILE_NEXT)
def test_signing_in_or_switching_language_leads_only_to_console_pages(api: Any, target: str) -> None:
    """Found by a hostile review: `next` took any path of the site, the instance proxy's too, so a link to our own
    sign-in page signed the victim's browser in to an attacker's instance ticket by a same-origin redirect (which
    the ticket route's refusal of other sites' links cannot see), on the console's origin."""
    c = Console(api)
    c.signup("next@example.com")
    c.post("/logout")
    r = c.post("/login", {"email": "next@example.com", "password": "tenant-password", "next": target},
               csrf_from="/login")  # fmt: skip
    assert (r.status_code, r.headers["location"]) == (303, "/"), target
    r = c.post("/lang", {"lang": "en", "next": target}, csrf_from="/keys")
    assert (r.status_code, r.headers["location"]) == (303, "/"), target
    for page in ("/workloads/wl_0123456789abcdef", "/ops/codes?page=2", "/"):  # the console's own pages stay
        assert c.post("/lang", {"lang": "en", "next": page}, csrf_from="/keys").headers["location"] == page


def test_ids_from_the_url_cannot_walk_to_another_operator_route(api: Any, ops: Console, monkeypatch: Any) -> None:
    """`/ops/codes/%2E%2E/void` must reach the API as one segment `%2E%2E`, never as `..` (which a client
    normalises into `/admin/void`)."""
    from suanli.web import apicall

    seen: list[str] = []
    real = apicall.call

    async def spy(request: Any, token: Any, method: str, path: str, **kw: Any) -> Any:
        seen.append(path)
        return await real(request, token, method, path, **kw)

    monkeypatch.setattr(apicall, "call", spy)
    csrf = csrf_of(ops.get("/ops/codes").text)
    for method, path in (("GET", "/ops/codes/%2E%2E"), ("POST", "/ops/codes/%2E%2E/void"),
                         ("GET", "/ops/nodes/%2E%2E"), ("POST", "/ops/nodes/%2E%2E/state"),
                         ("POST", "/ops/nodes/%2E%2E/faults"), ("POST", "/ops/quotas/%2E%2E")):  # fmt: skip
        r = api.request(method, path, data={"csrf": csrf, "state": "ready", "gpu": "0", "kind": "silent"},
                        follow_redirects=False)  # fmt: skip
        assert r.status_code < 500, (path, r.text[:300])
    walked = [p for p in seen if "/.." in p or p.endswith("..")]
    assert walked == [], walked


FIELDS = ("name", "size", "code", "email", "role", "replicas", "version", "message", "expires_in_days",
          "public_key", "monthly_spend_limit", "org", "next", "lang", "path", "kind", "since", "until", "after")  # fmt: skip
NASTY = ["", "\x00", "-1", "1e309", "NaN", "Infinity", "9" * 400, "\u202e\u0661", "..", "/", "%2F", "'\"<>",
         "\ud7ff" * 3, " " * 10, "1.5", "0x10", "\u00b2", "x" * 5000]  # fmt: skip


def test_fuzzed_forms_and_queries_never_answer_500(api: Any) -> None:
    c = Console(api)
    c.signup("fuzz@example.com")
    csrf = csrf_of(c.get("/keys").text)
    rnd = random.Random(22)
    tenant_routes = [(m, p) for m, p in ROUTES if not p.startswith("/ops") and p not in ("/logout", "/login",
                                                                                          "/signup")]  # fmt: skip
    for _ in range(120):
        method, path = rnd.choice(tenant_routes)
        data = {f: rnd.choice(NASTY) for f in rnd.sample(FIELDS, 4)}
        if method == "GET":
            r = api.get(path, params=data, follow_redirects=False)
        else:
            r = api.post(path, data={"csrf": csrf, **data}, follow_redirects=False)
        assert r.status_code < 500, (method, path, data, r.status_code, r.text[:300])
    assert c.get("/").status_code == 200


@pytest.fixture
def https(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    from suanli.api.app import create_app
    from tests.control_plane import settings

    with TestClient(create_app(settings(tmp_path / "home", db_url)), base_url="https://console.example") as client:
        yield client


@pytest.fixture
def behind_tls_proxy(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    """`public_url: https://…`, TLS ended by a proxy uvicorn does not trust: requests reach the app as plain http."""
    from suanli.api.app import create_app
    from tests.control_plane import settings

    app = create_app(settings(tmp_path / "home", db_url, public_url="https://console.example"))
    with TestClient(app, base_url="http://console.example") as client:
        yield client


def test_behind_a_tls_proxy_the_cookies_are_secure_host_cookies_still(behind_tls_proxy: TestClient) -> None:
    """Found by a hostile review: Secure and the `__Host-` names followed the request's scheme alone, so behind a
    TLS proxy not in FORWARDED_ALLOW_IPS the session cookie went out without Secure, under its bare name."""
    from starlette.requests import Request

    from suanli.web import session

    r = behind_tls_proxy.get("/signup")  # the anonymous page sets the CSRF cookie
    cookies = [v for k, v in r.headers.multi_items() if k == "set-cookie"]
    assert cookies and all(v.startswith("__Host-") and "secure" in v.lower() for v in cookies), cookies
    # and the session cookie by the same rule (this client speaks http: it would not send a Secure cookie back)
    request = Request({"type": "http", "scheme": "http", "path": "/", "headers": [], "app": behind_tls_proxy.app,
                       "server": ("console.example", 80)})  # fmt: skip
    assert session.cookie_name(request, session.SESSION_COOKIE) == "__Host-" + session.SESSION_COOKIE
    assert session.cookie_args(request)["secure"] is True


def test_over_https_no_sibling_host_can_plant_a_session_or_csrf_cookie(https: TestClient) -> None:
    """With `proxy_url`, a tenant's instance runs script on `wl-….i.example.com`, a sibling of the console's host:
    it can set a `Domain=example.com` cookie named like the console's. Over HTTPS the console's cookies are
    `__Host-` cookies (Secure, Path=/, no Domain: a browser lets no other host set or shadow them), and a plain
    `suanli_session` (the attacker's own token, planted so the victim redeems codes into the attacker's org) is
    never read."""
    victim, attacker = Console(https), Console(TestClient(https.app, base_url="https://console.example"))
    attacker.signup("attacker@example.com")
    planted = attacker.c.cookies.get("__Host-suanli_session")
    assert planted, attacker.c.cookies
    page = victim.get("/signup")
    cookie = next(v for k, v in page.headers.multi_items() if k == "set-cookie")
    assert cookie.startswith("__Host-suanli_csrf=") and "Secure" in cookie and "Domain" not in cookie
    victim.signup("victim@example.com")
    assert https.cookies.get("__Host-suanli_session") and https.cookies.get("suanli_session") is None
    https.cookies.set("suanli_session", planted)  # what the sibling host's script would toss
    home = victim.get("/", headers={"Accept-Language": "en"})
    assert "victim@example.com" in home.text and "attacker@example.com" not in home.text
    https.cookies.delete("__Host-suanli_session")
    assert victim.get("/").status_code == 303  # the planted cookie alone is no session
    # nor is a planted double-submit cookie a way to log the victim in as the attacker (login CSRF)
    https.cookies.set("suanli_csrf", "planted-token")
    r = https.post("/login", data={"csrf": "planted-token", "email": "attacker@example.com",
                                   "password": "tenant-password", "next": "/"}, follow_redirects=False)  # fmt: skip
    assert r.status_code == 403


def test_logging_in_again_revokes_the_session_it_replaces(api: Any) -> None:
    c = Console(api)
    c.signup("again@example.com", "pw-again-123")
    old = api.cookies.get("suanli_session")
    c.login("again@example.com", "pw-again-123")
    new = api.cookies.get("suanli_session")
    assert new and new != old
    assert api.get("/api/v1/me", headers=bearer(old)).status_code == 401
    assert api.get("/api/v1/me", headers=bearer(new)).status_code == 200


def test_the_console_session_never_reaches_a_tenants_instance() -> None:
    """Without `proxy_url` instances answer under `/i/<id>/` on the console's own host, where the browser sends the
    console's `suanli_session` (Path=/) too: the proxy forwarded it, so a tenant's JupyterLab or port service read a
    visitor's console token from its Cookie header (the whole account, for a day). No cookie of this server
    reaches an instance; the instance's own cookies do."""
    from suanli.api import proxy_headers
    from suanli.web import session

    names = [session.SESSION_COOKIE, session.CSRF_COOKIE, session.ORG_COOKIE, "suanli_lang", "suanli_proxy"]
    header = "; ".join([*(f"{n}=SECRET{i}" for i, n in enumerate(names)),
                        *(f"__Host-{n}=HOSTSECRET{i}" for i, n in enumerate(names)), "_xsrf=jupyter", "a=b"])  # fmt: skip
    kept = proxy_headers.strip_cookie(header)
    assert "SECRET" not in kept, kept
    assert kept == "_xsrf=jupyter; a=b"


def test_guessing_codes_through_the_console_is_throttled_like_the_api(api: Any) -> None:
    """The console's redeem form is no way around the API's throttle: the same buckets (the user, the browser's
    address) count its tries, and the 429 is shown at the code's field."""
    from suanli.control.money import topup_codes

    c = Console(api)
    c.signup("guess@example.com")
    csrf = csrf_of(c.get("/wallet").text)
    for i in range(topup_codes.REDEEM_USER.capacity):
        r = api.post("/wallet/redeem", data={"csrf": csrf, "code": f"AAAAA-AAAAA-AAAAA-{i:05d}"})
        assert r.status_code == 404, r.text[:300]
    r = api.post("/wallet/redeem", data={"csrf": csrf, "code": "AAAAA-AAAAA-AAAAA-99999"})
    assert r.status_code == 429 and "code" in r.text
    me = bearer(api.cookies.get("suanli_session"))
    org = api.get("/api/v1/me", headers=me).json()["user"]["personal_org_id"]
    r = api.post(f"/api/v1/orgs/{org}/redeem", json={"code": "AAAAA-AAAAA-AAAAA-99998"}, headers=me)
    assert r.status_code == 429, r.text


def test_a_hostile_org_name_in_the_heat_maps_inline_state_stays_data(api: Any, ops: Console, monkeypatch: Any) -> None:
    """Org names are a tenant's free text (up to 128 characters) and the heat map carries them inline in a
    `<script type="application/json">` block: `</script>` or `<!--` in one must not end or comment out the block."""
    import json

    from suanli.web.pages import ops_cluster

    r = api.post("/api/v1/admin/clusters", json={"preset": "h20-roce800-128", "name": "h20"},
                 headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 201, r.text
    real = ops_cluster._by_node

    def owned(gpus: Any) -> Any:
        out = real(gpus)
        for cells in out.values():
            for g in cells:
                g["org"] = "org_evil"
        return out

    async def names(page: Any) -> dict[str, str]:
        return {"org_evil": XSS}

    monkeypatch.setattr(ops_cluster, "_by_node", owned)
    monkeypatch.setattr(ops_cluster, "_org_names", names)
    html = ops.get("/ops/cluster").text
    m = re.search(r'<script type="application/json" id="heat-state">(.*?)</script>', html, re.S)
    assert m and "<" not in m.group(1)
    assert json.loads(m.group(1))["owners"] == [XSS]
    assert "<script>alert" not in html and "<img src=x" not in html


@pytest.mark.parametrize("value", [b"\xe9abc", b"abc\x01def", b"\xff" * 10, b"sl_" + b"A" * 300])
def test_a_mangled_session_cookie_is_no_session_never_a_500(api: Any, value: bytes) -> None:
    """A cookie's bytes are the browser's (or a sibling host's, planting one over HTTP): a session cookie that is not
    a token's shape was sent on as `Authorization: Bearer …` and httpx refused the non-ASCII header (500 on every
    page, the sign-in page too, until the cookie was cleared by hand). It is no session now: to /login, cookie
    dropped; the sign-in page works."""
    for name in (b"suanli_session", b"suanli_csrf", b"suanli_org"):
        cookie = {"Cookie": name + b"=" + value}
        r = api.get("/", headers=cookie, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), (name, r.status_code)
        for path in ("/login", "/signup"):
            r = api.get(path, headers=cookie, follow_redirects=False)
            assert r.status_code == 200, (name, path, r.status_code)
        r = api.post("/lang", headers=cookie, data={"csrf": "x", "lang": "en"}, follow_redirects=False)
        assert r.status_code == 403, (name, r.status_code)
