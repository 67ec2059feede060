"""Forgot password: ask for a reset link (`/forgot`), and the page the link lands on (`/reset`). The link's GET
only shows the form: mail scanners fetch links before the user does, and the token is spent only by the form's
POST, with the new password."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from suanli.control.accounts.links import TOKEN_MAX
from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.pages.account_forms import passwords_differ
from suanli.web.session import Page

router = APIRouter()
Anon = Annotated[Page, Depends(session.anonymous)]


@router.get("/forgot")
async def forgot_form(page: Anon) -> Response:
    return page.render("forgot.html", email="", error=None, fields={}, done=None)


@router.post("/forgot")
async def forgot(request: Request, page: Anon) -> Response:
    data = await session.form(request, page)
    email = data.get("email", "").strip()[:254]
    try:
        r = (await page.api("POST", "/password/forgot", json={"email": email})).json()
    except ApiError as e:
        return page.render("forgot.html", status=e.status, email=email, error=e.detail, fields=e.fields(), done=None)
    done = page.t("If an account has this address, a link to reset its password is on its way. It works once, "
                  "within the hour.", "如果有账号使用此邮箱，重置密码的链接已发出。链接仅可使用一次，一小时内有效。")  # fmt: skip
    return page.render("forgot.html", email="", error=None, fields={}, done=done if r.get("detail") else None)


@router.get("/reset")
async def reset_form(page: Anon, token: str = "") -> Response:
    token = token.strip()[: TOKEN_MAX + 1]  # longer cannot be ours; the API says so at the field
    return page.render("reset.html", token=token, error=None, fields={}, done=None)


@router.post("/reset")
async def reset(request: Request, page: Anon) -> Response:
    data = await session.form(request, page)
    token = data.get("token", "").strip()[: TOKEN_MAX + 1]
    if (fields := passwords_differ(page, data)) is not None:
        return page.render("reset.html", status=422, token=token, error=None, fields=fields, done=None)
    body = {"token": token, "new_password": data.get("new_password", "")}
    try:
        r = (await page.api("POST", "/password/reset", json=body)).json()
    except ApiError as e:
        fields = e.fields()
        bad_token = "token" in fields or e.detail.startswith("token:")
        return page.render("reset.html", status=e.status, token="" if bad_token else token,
                           error=fields.get("token") or e.detail, fields=fields, done=None)  # fmt: skip
    keys = int(r.get("removed_ssh_keys", 0))
    done = page.t(f"The password of {r['email']} is set. Every session was signed out and {keys} SSH key(s) were "
                  "removed: log in with the new password, and add your SSH keys again.",
                  f"{r['email']} 的密码已设置。所有会话均已退出，已删除 {keys} 个 SSH 公钥：请用新密码登录，并重新添加你的 "
                  "SSH 公钥。")  # fmt: skip
    return page.render("reset.html", token="", error=None, fields={}, done=done)
