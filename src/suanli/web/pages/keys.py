"""API tokens (create with a name and an expiry, shown once; revoke), SSH public keys (add, remove) and the
password (change it, knowing the current one: every other session and token is revoked, this browser's stays)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from suanli.web import once, session
from suanli.web.apicall import ApiError
from suanli.web.pages.account_forms import Tenant, at_fields, done, integer_or_text, passwords_differ, seg
from suanli.web.session import Page

router = APIRouter()


async def _view(page: Page, status: int = 200, **extra: Any) -> Response:
    tokens = await page.get("/tokens")
    mine = page.token or ""
    for t in tokens:
        t["this_session"] = bool(t["prefix"]) and mine.startswith(t["prefix"])
    ctx: dict[str, Any] = {"tokens": tokens, "ssh_keys": await page.get("/keys"), "new_token": None,
                           "error": None, "fields": {}, "token_form": {}, "key_form": {}, "form": None,
                           "password_changed": None}  # fmt: skip
    ctx.update(extra)
    return page.render("account/keys.html", status=status, **ctx)


def _failed(e: ApiError, form: str, default_field: str, known: tuple[str, ...]) -> dict[str, Any]:
    """The API's refusal at its fields, for the form that posted."""
    return {"status": e.status, "fields": at_fields(e, default_field, known), "form": form}


@router.get("/keys")
async def keys(page: Tenant) -> Response:
    """The page; right after a token was made, its secret this once (web/once.py); right after a password change,
    how many other tokens it revoked (held the same way: a link cannot make the page say so)."""
    shown = await once.take(page, "/keys")
    if isinstance(shown, dict) and "password_changed" in shown:
        return await _view(page, password_changed=int(shown["password_changed"]))
    return await _view(page, new_token=shown)


@router.post("/keys/tokens")
async def create_token(request: Request, page: Tenant) -> Response:
    """A new API token; its secret is shown on the next GET of /keys only (the API keeps a hash): the answer is a
    redirect, so a reload or the back button never posts the form again."""
    data = await session.form(request, page)
    body = {"name": data.get("name", "").strip(), "expires_in_days": integer_or_text(data.get("expires_in_days"))}
    if data.get("password"):  # a console session lasts a day: every key made here outlives it (`POST /tokens`)
        body["password"] = data["password"]
    try:
        made = (await page.api("POST", "/tokens", json=body)).json()
    except ApiError as e:
        form = {k: v for k, v in data.items() if k != "password"}  # never sent back into the page
        return await _view(
            page, token_form=form, **_failed(e, "token", "name", ("name", "expires_in_days", "password"))
        )
    return await once.redirect(page, "/keys", made, lambda: _view(page, new_token=made))


@router.post("/keys/tokens/{token_id}/revoke")
async def revoke_token(token_id: str, request: Request, page: Tenant) -> Response:
    await session.form(request, page)
    try:
        await page.api("DELETE", f"/tokens/{seg(token_id)}")
    except ApiError as e:
        return await _view(page, status=e.status, error=e.detail)
    return done("/keys")


@router.post("/keys/ssh")
async def add_ssh_key(request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    body = {"public_key": data.get("public_key", "").strip(), "name": data.get("name", "").strip() or None}
    if data.get("password"):  # a key never expires; the console's session does (`POST /keys`)
        body["password"] = data["password"]
    try:
        await page.api("POST", "/keys", json=body)
    except ApiError as e:
        form = {k: v for k, v in data.items() if k != "password"}  # never sent back into the page
        return await _view(page, key_form=form, **_failed(e, "ssh", "public_key", ("public_key", "name", "password")))
    return done("/keys")


@router.post("/keys/ssh/{key_id}/remove")
async def remove_ssh_key(key_id: str, request: Request, page: Tenant) -> Response:
    await session.form(request, page)
    try:
        await page.api("DELETE", f"/keys/{seg(key_id)}")
    except ApiError as e:
        return await _view(page, status=e.status, error=e.detail)
    return done("/keys")


@router.post("/keys/password")
async def change_password(request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    if (fields := passwords_differ(page, data)) is not None:
        return await _view(page, status=422, fields=fields, form="password")
    body = {"current_password": data.get("current_password", ""), "new_password": data.get("new_password", "")}
    try:
        out = (await page.api("PUT", "/me/password", json=body)).json()
    except ApiError as e:
        known = ("current_password", "new_password")
        return await _view(page, **_failed(e, "password", "current_password", known))
    said = {"password_changed": int(out["revoked_tokens"])}
    return await once.redirect(page, "/keys", said, lambda: _view(page, password_changed=said["password_changed"]))
