"""The team: the organisation's members and roles (change, remove, leave), its invitations (invite by email with
a role, revoke), the caller's own pending invitations (accept, decline), and a new team organisation. What a
role may do is the API's rule: the page offers the forms and shows the API's refusal as it is."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from suanli.web import once, session
from suanli.web.apicall import ApiError
from suanli.web.pages.account_forms import Tenant, at_fields, done, seg
from suanli.web.session import Page

router = APIRouter()
ROLES = ("owner", "admin", "member", "viewer")
MANAGERS = ("owner", "admin")


async def _view(page: Page, status: int = 200, **extra: Any) -> Response:
    org = page.org
    members = await page.get(f"/orgs/{seg(org['id'])}/members")
    invitations: list[dict[str, Any]] = []
    if org.get("role") in MANAGERS and not org.get("personal"):
        invitations = await page.get(f"/orgs/{seg(org['id'])}/invitations")
    ctx: dict[str, Any] = {"members": members, "invitations": invitations, "mine": await page.get("/invitations"),
                           "roles": ROLES, "error": None, "fields": {}, "form": None, "invite_form": {},
                           "new_invitation": None, "can_manage": org.get("role") in MANAGERS}  # fmt: skip
    ctx.update(extra)
    return page.render("account/team.html", status=status, **ctx)


async def _act(page: Page, method: str, path: str, back: str = "/team", **kw: Any) -> Response:
    """One API call for a button; back to the page, or the page with the API's refusal."""
    try:
        await page.api(method, path, **kw)
    except ApiError as e:
        return await _view(page, status=e.status, error=e.detail)
    return done(back)


@router.get("/team")
async def team(page: Tenant) -> Response:
    """The page; right after an invitation was made, its code this once (web/once.py)."""
    return await _view(page, new_invitation=await once.take(page, "/team"))


@router.post("/team/members/{user_id}/role")
async def change_role(user_id: str, request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    org = seg(page.org["id"])
    return await _act(page, "PATCH", f"/orgs/{org}/members/{seg(user_id)}", json={"role": data.get("role", "")})


@router.post("/team/members/{user_id}/remove")
async def remove_member(user_id: str, request: Request, page: Tenant) -> Response:
    """Remove a member, or (yourself) leave the organisation: then back to your personal one."""
    await session.form(request, page)
    r = await _act(page, "DELETE", f"/orgs/{seg(page.org['id'])}/members/{seg(user_id)}")
    if isinstance(r, RedirectResponse) and user_id == page.user.get("id"):
        session.delete_cookie(r, request, session.ORG_COOKIE)
    return r


@router.post("/team/invitations")
async def invite(request: Request, page: Tenant) -> Response:
    """Invite an email with a role (and a monthly spend limit); the invitation's code is shown once, on the GET
    the answer redirects to."""
    data = await session.form(request, page)
    body: dict[str, Any] = {"email": data.get("email", "").strip(), "role": data.get("role", "member")}
    if data.get("monthly_spend_limit", "").strip():
        body["monthly_spend_limit"] = data["monthly_spend_limit"].strip()
    try:
        made = (await page.api("POST", f"/orgs/{seg(page.org['id'])}/invitations", json=body)).json()
    except ApiError as e:
        fields = at_fields(e, "email", ("email", "role", "monthly_spend_limit"))
        return await _view(page, status=e.status, fields=fields, form="invite", invite_form=data)
    return await once.redirect(page, "/team", made, lambda: _view(page, new_invitation=made))


@router.post("/team/invitations/{invitation_id}/revoke")
async def revoke_invitation(invitation_id: str, request: Request, page: Tenant) -> Response:
    await session.form(request, page)
    return await _act(page, "DELETE", f"/orgs/{seg(page.org['id'])}/invitations/{seg(invitation_id)}")


@router.post("/team/mine/{invitation_id}/{answer}")
async def answer_invitation(invitation_id: str, answer: str, request: Request, page: Tenant) -> Response:
    """Accept (then the console acts for the organisation joined) or decline an invitation to you."""
    await session.form(request, page)
    if answer not in ("accept", "decline"):
        return await _view(page, status=404, error=page.t("No such answer.", "无此操作。"))
    try:
        joined = (await page.api("POST", f"/invitations/{seg(invitation_id)}/{answer}")).json()
    except ApiError as e:
        return await _view(page, status=e.status, error=e.detail)
    r = done("/team")
    if answer == "accept":
        session.set_cookie(r, request, session.ORG_COOKIE, joined["id"], 365 * 86400)
    return r


@router.post("/team/orgs")
async def create_org(request: Request, page: Tenant) -> Response:
    """A new team organisation owned by the caller; the console then acts for it."""
    data = await session.form(request, page)
    try:
        made = (await page.api("POST", "/orgs", json={"name": data.get("name", "").strip()})).json()
    except ApiError as e:
        return await _view(page, status=e.status, fields=at_fields(e, "name", ("name",)), form="org")
    r = done("/team")
    session.set_cookie(r, request, session.ORG_COOKIE, made["id"], 365 * 86400)
    return r
