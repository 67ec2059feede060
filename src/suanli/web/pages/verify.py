"""The page a verification e-mail's link lands on. Its GET only shows a button: mail scanners fetch links before the
user does, and a GET that redeemed the token would spend it (and release the credit) without the user. The button
POSTs the token to the API, which verifies the user it was mailed to, whoever is logged in here, or nobody."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from suanli.control.accounts.links import TOKEN_MAX
from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.render import money
from suanli.web.session import Page

router = APIRouter()
Anon = Annotated[Page, Depends(session.anonymous)]


@router.get("/verify")
async def verify_form(page: Anon, token: str = "") -> Response:
    token = token.strip()[: TOKEN_MAX + 1]  # longer cannot be ours; the API says so at the field
    return page.render("verify.html", token=token, error=None, done=None)


@router.post("/verify")
async def verify(request: Request, page: Anon) -> Response:
    data = await session.form(request, page)
    token = data.get("token", "").strip()
    try:
        r = (await page.api("POST", "/verify", json={"token": token})).json()
    except ApiError as e:
        error = e.fields().get("token") or e.detail
        return page.render("verify.html", status=e.status, token="", error=error, done=None)
    credited, balance = money(r["credited"]), money(r["balance"])
    done = page.t(
        f"{r['email']} is verified. Trial credit: {credited}; the balance is now {balance}.",
        f"{r['email']} 已验证。试用额度：{credited}，当前余额 {balance}。",
    )
    return page.render("verify.html", token="", error=None, done=done)
