"""Log in, sign up, log out, the language switch and the organisation switch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from suanli.web import apicall, i18n, nav, session
from suanli.web.apicall import ApiError
from suanli.web.session import Page

router = APIRouter()
Anon = Annotated[Page, Depends(session.anonymous)]
Tenant = Annotated[Page, Depends(session.tenant)]


# Where a sign-in or a language switch may lead: the menu's pages (their first path segment), not the instance proxy
# (`/i/...`): a same-origin redirect from our sign-in form to an attacker's instance ticket got past the ticket
# route's refusal of links from other sites, signing the victim's browser in to the attacker's instance.
NEXT_PAGES = frozenset(href.split("/")[1] for href, _, _ in (*nav.TENANT, *nav.OPERATOR))


def _safe_next(target: str | None) -> str:
    """Only a console page of this site (no scheme, no host, not `//evil`, no dot segment a browser would resolve,
    no control character a browser would drop): an open redirect would lend our name to phishing."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in target):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/"
    segments = [unquote(x) for x in parts.path.split("/")[1:]]
    if any(x in (".", "..") for x in segments) or segments[0] not in NEXT_PAGES:
        return "/"
    return target


async def _start_session(page: Page, login: dict[str, Any], password: str, target: str) -> Response:
    """Trade the login token for a one-day console token, revoke the login token and the session this browser
    had before (signing in again, or as someone else, leaves no older token alive), set the cookie. Where the login
    token expires within the day (`login_token_days` 1), the console token would outlive it: the password just
    given goes with the request, as `POST /tokens` asks."""
    replaced, page.token = page.token, str(login["token"])
    body: dict[str, Any] = {"name": "web console", "expires_in_days": session.SESSION_DAYS}
    ends = login.get("expires_at")
    if ends and datetime.fromisoformat(ends) <= datetime.now(UTC) + timedelta(days=session.SESSION_DAYS, hours=1):
        body["password"] = password
    made = (await page.api("POST", "/tokens", json=body)).json()
    await page.api("POST", "/logout")
    if replaced:  # whatever it was (expired, someone else's): it stops working now
        await apicall.call(page.request, replaced, "POST", "/logout")
    resp = RedirectResponse(_safe_next(target), status_code=303)
    session.set_cookie(resp, page.request, session.SESSION_COOKIE, made["token"], session.SESSION_DAYS * 86400)
    session.delete_cookie(resp, page.request, session.CSRF_COOKIE)
    return resp


@router.get("/login")
async def login_form(page: Anon, next: str = "/") -> Response:
    return page.render("login.html", next=_safe_next(next), error=None, email="")


@router.post("/login")
async def login(request: Request, page: Anon) -> Response:
    data = await session.form(request, page)
    email, target = data.get("email", ""), data.get("next", "/")
    try:
        r = await page.api("POST", "/login", json={"email": email, "password": data.get("password", "")})
    except ApiError as e:
        return page.render("login.html", status=e.status, next=_safe_next(target), error=e.detail, email=email)
    return await _start_session(page, r.json(), data.get("password", ""), target)


@router.get("/signup")
async def signup_form(page: Anon) -> Response:
    return page.render("signup.html", error=None, fields={}, email="")


@router.post("/signup")
async def signup(request: Request, page: Anon) -> Response:
    data = await session.form(request, page)
    body = {"email": data.get("email", ""), "password": data.get("password", "")}
    if data.get("invite"):
        body["invite"] = data["invite"]
    try:
        r = await page.api("POST", "/signup", json=body)
    except ApiError as e:
        return page.render("signup.html", status=e.status, error=e.detail, fields=e.fields(), email=body["email"])
    return await _start_session(page, r.json(), body["password"], "/")


@router.post("/logout")
async def logout(request: Request, page: Tenant) -> Response:
    await session.form(request, page)
    await page.api("POST", "/logout")
    resp = RedirectResponse("/login", status_code=303)
    session.delete_cookie(resp, request, session.SESSION_COOKIE)
    return resp


@router.post("/lang")
async def switch_language(request: Request, page: Anon) -> Response:
    data = await session.form(request, page)
    lang = data.get("lang") if data.get("lang") in i18n.LANGS else "zh"
    resp = RedirectResponse(_safe_next(data.get("next")), status_code=303)
    resp.set_cookie(i18n.LANG_COOKIE, lang, max_age=365 * 86400, **session.cookie_args(request))
    return page.finish(resp)


@router.post("/org")
async def switch_org(request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    org = data.get("org", "")
    if org not in {o["id"] for o in page.orgs}:
        raise session.Forbidden(page.t("Not an organisation of yours.", "不是你所在的组织。"))
    resp = RedirectResponse(_safe_next(data.get("next")), status_code=303)
    session.set_cookie(resp, request, session.ORG_COOKIE, org, 365 * 86400)
    return resp
