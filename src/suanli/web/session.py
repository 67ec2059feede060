"""Who is looking at a page: the session cookie, the CSRF token, the language, the chosen organisation.

- The session is an API token of its own (`web console`, one day), kept in an HttpOnly, SameSite=Lax cookie:
  script on a page cannot read it, and other sites' forms do not carry it. Logging out revokes it at the API.
- CSRF: every form and every htmx request carries a token. Signed in, it is an HMAC of the session token (a page
  of another site can read neither); signed out (login, sign-up), it is a random cookie the form must repeat
  (double submit). A state-changing request without the right one is refused with 403 before anything runs.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup

from suanli.web import apicall, i18n
from suanli.web.render import ENV

SESSION_COOKIE = "suanli_session"
CSRF_COOKIE = "suanli_csrf"
ORG_COOKIE = "suanli_org"
SESSION_DAYS = 1
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
TOKEN_RE = re.compile(r"[A-Za-z0-9_.~+/=-]{1,256}")  # an API token's (and the CSRF cookie's) characters
# No page of the console may be framed by another site (clickjacking), sniffed into another type, or leak its
# address (which may carry a workload's name) to another site.
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    # scripts only from the console's own files (no inline script or handler): a slip in escaping tenant text on a
    # page (operators' pages show much of it) would not run
    "Content-Security-Policy": "frame-ancestors 'none'; script-src 'self'; object-src 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class LoginRequired(Exception):
    """No valid session: the handler sends the browser to /login (htmx: an HX-Redirect)."""


class Forbidden(Exception):
    """Signed in, but not allowed (an operator page, a wrong CSRF token): a 403 page."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def csrf_of_session(token: str) -> str:
    return hmac.new(token.encode(), b"suanli-console-csrf", hashlib.sha256).hexdigest()[:40]


def over_https(request: Request) -> bool:
    """The browser is on HTTPS: the request came so, or the server's `public_url` says its users are (TLS ended by a
    proxy uvicorn does not trust, FORWARDED_ALLOW_IPS, reaches us as plain http; its cookies must still be Secure)."""
    if request.url.scheme == "https":
        return True
    server = getattr(request.app.state, "server", None)
    public = getattr(getattr(server, "settings", None), "public_url", None) or ""
    return public.startswith("https://")


def cookie_args(request: Request) -> dict[str, Any]:
    return {"httponly": True, "samesite": "lax", "secure": over_https(request), "path": "/"}


def cookie_name(request: Request, base: str) -> str:
    """Over HTTPS the console's own cookies are `__Host-` cookies: Secure, Path=/ and no Domain, so no other host
    can set or shadow them. A tenant's instance on a sibling host (`proxy_url: https://{id}.i.example.com`) could
    otherwise plant `suanli_session=<its own token>` for the parent domain, and the victim would then act in the
    attacker's account (redeem a top-up code into it) or be logged in as the attacker (a planted CSRF cookie).
    Plain HTTP cannot carry the prefix (browsers require Secure), so there the names stay bare."""
    return "__Host-" + base if over_https(request) else base


def read_cookie(request: Request, base: str) -> str | None:
    return request.cookies.get(cookie_name(request, base))


def set_cookie(resp: Response, request: Request, base: str, value: str, max_age: int) -> None:
    resp.set_cookie(cookie_name(request, base), value, max_age=max_age, **cookie_args(request))


def delete_cookie(resp: Response, request: Request, base: str) -> None:
    resp.delete_cookie(cookie_name(request, base), **cookie_args(request))


@dataclass
class Page:
    """One request's view: the language, the CSRF token, and (signed in) the token, the user and their orgs."""

    request: Request
    lang: str
    csrf: str
    token: str | None = None
    me: dict[str, Any] | None = None
    new_csrf_cookie: str | None = None  # set on the response when the anonymous double-submit cookie is new
    flash: list[str] = field(default_factory=list)
    clear_cookies: list[str] = field(default_factory=list)  # console cookies this answer deletes (a taken `once`)
    set_cookies: dict[str, tuple[str, int]] = field(default_factory=dict)  # console cookies it sets: value, max age
    once_lost: bool = False  # a secret made by the last form could not be shown (web/once.py)

    @property
    def user(self) -> dict[str, Any]:
        return (self.me or {}).get("user", {})

    @property
    def is_admin(self) -> bool:
        return bool(self.user.get("is_admin"))

    @property
    def orgs(self) -> list[dict[str, Any]]:
        return (self.me or {}).get("orgs", [])

    @property
    def org(self) -> dict[str, Any]:
        """The organisation the pages act for: the switch's cookie when it names one of the user's, else personal."""
        wanted = read_cookie(self.request, ORG_COOKIE)
        for o in self.orgs:
            if o["id"] == wanted:
                return o
        for o in self.orgs:
            if o["id"] == self.user.get("personal_org_id"):
                return o
        return self.orgs[0] if self.orgs else {"id": "", "name": "", "role": None}

    def t(self, en: str, zh: str) -> str:
        return i18n.translate(self.lang, en, zh)

    async def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """An API call as this user; an `ApiError` unless it succeeded. A 401 means the session ended."""
        r = await apicall.call(self.request, self.token, method, path, **kwargs)
        if r.status_code == 401 and self.token is not None:
            raise LoginRequired()
        return apicall.raise_for(r)

    async def get(self, path: str, **params: Any) -> Any:
        return (await self.api("GET", path, params={k: v for k, v in params.items() if v is not None})).json()

    def render(self, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        html = ENV.get_template(template).render(page=self, t=self.t, csrf_input=self.csrf_input(), **ctx)
        resp = HTMLResponse(html, status_code=status)
        self.finish(resp)
        return resp

    def csrf_input(self) -> Markup:
        return Markup('<input type="hidden" name="{}" value="{}">').format(CSRF_FIELD, self.csrf)

    def finish(self, resp: Response) -> Response:
        if self.new_csrf_cookie:
            set_cookie(resp, self.request, CSRF_COOKIE, self.new_csrf_cookie, 7 * 86400)
        for name in self.clear_cookies:
            delete_cookie(resp, self.request, name)
        for name, (value, max_age) in self.set_cookies.items():
            set_cookie(resp, self.request, name, value, max_age)
        resp.headers.setdefault("Cache-Control", "no-store")
        for k, v in SECURITY_HEADERS.items():
            resp.headers.setdefault(k, v)
        return resp


def _lang(request: Request) -> str:
    return i18n.pick(request.cookies.get(i18n.LANG_COOKIE), request.headers.get("accept-language"))


def _session_token(request: Request) -> str | None:
    """The session cookie when it has a token's shape; anything else (non-ASCII bytes a browser kept, a sibling
    host's planted junk) is no session, never a header httpx refuses to send (500 on every page)."""
    token = read_cookie(request, SESSION_COOKIE)
    return token if token and TOKEN_RE.fullmatch(token) else None


async def anonymous(request: Request) -> Page:
    """A page anyone may see (login, sign-up): the double-submit CSRF cookie, made when missing."""
    token = _session_token(request)
    if token:
        return Page(request, _lang(request), csrf_of_session(token), token=token)
    cookie = read_cookie(request, CSRF_COOKIE)
    fresh = None
    if not cookie or not TOKEN_RE.fullmatch(cookie) or len(cookie) > 64:
        cookie = fresh = secrets.token_urlsafe(24)
    return Page(request, _lang(request), cookie, new_csrf_cookie=fresh)


async def tenant(request: Request) -> Page:
    """A signed-in user's page; no valid session → /login."""
    token = _session_token(request)
    if token is None:
        raise LoginRequired()
    page = Page(request, _lang(request), csrf_of_session(token), token=token)
    r = await apicall.call(request, token, "GET", "/me")
    if r.status_code != 200:
        raise LoginRequired()
    page.me = r.json()
    return page


async def operator(request: Request) -> Page:
    """An operator's page: refused (403) to everyone else, before anything is read."""
    page = await tenant(request)
    if not page.is_admin:
        raise Forbidden(page.t("This page is for the operator.", "此页面仅限运营方。"))
    return page


async def form(request: Request, page: Page) -> dict[str, str]:
    """The posted form, once its CSRF token matched; 403 otherwise (nothing has run yet)."""
    data = await request.form()
    sent = request.headers.get(CSRF_HEADER) or data.get(CSRF_FIELD)
    if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), page.csrf.encode()):
        raise Forbidden(page.t("The form's security token is missing or wrong: reload the page and try again.",
                               "表单安全令牌缺失或不正确：请刷新页面后重试。"))  # fmt: skip
    return {k: v for k, v in data.items() if isinstance(v, str)}


async def check_csrf(request: Request, page: Page) -> None:
    """For a state-changing request without a form body (htmx's hx-post with no inputs): the header or the
    form field must carry the token."""
    await form(request, page)


def login_url(request: Request) -> str:
    target = request.url.path + (("?" + request.url.query) if request.url.query else "")
    return "/login?next=" + quote(target, safe="")
