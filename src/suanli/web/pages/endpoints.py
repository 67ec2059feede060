"""Endpoints: each with its state (replicas ready of desired), its usage (requests, tokens, and what other orgs'
keys paid per token), its API keys (created and shown once, revoked) and a scale form.

Token charges are the API's own per usage row (`charged`: what another org's key paid for the tokens already
charged; the endpoint's own keys pay nothing per token: its org pays its replicas' GPU time, which the statement
shows)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from suanli.web import once, session
from suanli.web.apicall import ApiError
from suanli.web.pages.account_forms import Tenant, at_fields, done, integer_or_text, missing, seg
from suanli.web.session import Page

router = APIRouter()
RECENT_MINUTES = 30  # usage rows shown on an endpoint's page


def _totals(e: dict[str, Any], usage: list[dict[str, Any]], keys: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests and tokens over the API's usage rows, per key and in all, and what other orgs' keys were charged."""
    per_key: dict[str, dict[str, Any]] = {}
    for u in usage:
        k = per_key.setdefault(u["key_id"], {"requests": 0, "prompt": 0, "completion": 0, "charged": Decimal(0)})
        k["requests"] += u["requests"]
        k["prompt"] += u["prompt_tokens"]
        k["completion"] += u["completion_tokens"]
        k["charged"] += Decimal(u["charged"])
    total = {f: sum((k[f] for k in per_key.values()), start=Decimal(0) if f == "charged" else 0)
             for f in ("requests", "prompt", "completion", "charged")}  # fmt: skip
    return {"per_key": per_key, "total": total}


async def _usage(page: Page, e: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return await page.get(f"/endpoints/{seg(e['id'])}/usage"), await page.get(f"/endpoints/{seg(e['id'])}/keys")


@router.get("/endpoints")
async def endpoints(page: Tenant) -> Response:
    """The endpoints of the org the console acts for, with their usage."""
    rows = [e for e in await page.get("/endpoints") if e["org_id"] == page.org["id"]]
    for e in rows:
        e["usage"] = _totals(e, *await _usage(page, e))["total"]
    return page.render("account/endpoints.html", endpoints=rows)


async def _view(page: Page, ref: str, status: int = 200, **extra: Any) -> Response:
    e = await page.get(f"/endpoints/{seg(ref)}")
    usage, keys = await _usage(page, e)
    ctx: dict[str, Any] = {"e": e, "keys": keys, "usage": _totals(e, usage, keys), "recent": usage[:RECENT_MINUTES],
                           "key_names": {k["id"]: k["name"] for k in keys}, "new_key": None, "error": None,
                           "fields": {}, "form": None}  # fmt: skip
    ctx.update(extra)
    return page.render("account/endpoint.html", status=status, **ctx)


async def _again(page: Page, ref: str, e: ApiError, form: str, known: tuple[str, ...], default: str) -> Response:
    """The endpoint's page with the API's refusal at the form's field; the API's 404 when it is not the caller's."""
    try:
        return await _view(page, ref, status=e.status, error=e.detail, form=form, fields=at_fields(e, default, known))
    except ApiError as gone:
        return missing(page, gone, "/endpoints")


@router.get("/endpoints/{ref}")
async def endpoint(ref: str, page: Tenant) -> Response:
    try:
        return await _view(page, ref, new_key=await once.take(page, f"/endpoints/{seg(ref)}"))
    except ApiError as e:
        return missing(page, e, "/endpoints")


@router.post("/endpoints/{ref}/scale")
async def scale(ref: str, request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    replicas = integer_or_text(data.get("replicas"))
    try:
        await page.api("POST", f"/endpoints/{seg(ref)}/scale", json={"replicas": "" if replicas is None else replicas})
    except ApiError as e:
        return await _again(page, ref, e, "scale", ("replicas",), "replicas")
    return done(f"/endpoints/{seg(ref)}")


@router.post("/endpoints/{ref}/keys")
async def create_key(ref: str, request: Request, page: Tenant) -> Response:
    """A key for the endpoint, paid by the org the console acts for; shown once, on the GET the answer redirects
    to."""
    data = await session.form(request, page)
    body = {"name": data.get("name", "").strip() or "default", "org": page.org["id"]}
    if data.get("password"):  # a key never expires; the console's session does (`POST /endpoints/{ref}/keys`)
        body["password"] = data["password"]
    try:
        made = (await page.api("POST", f"/endpoints/{seg(ref)}/keys", json=body)).json()
    except ApiError as e:
        return await _again(page, ref, e, "key", ("name", "org", "password"), "name")
    return await once.redirect(page, f"/endpoints/{seg(ref)}", made, lambda: _view(page, ref, new_key=made))


@router.post("/endpoints/{ref}/keys/{key_id}/revoke")
async def revoke_key(ref: str, key_id: str, request: Request, page: Tenant) -> Response:
    await session.form(request, page)
    try:
        await page.api("DELETE", f"/endpoint-keys/{seg(key_id)}")
    except ApiError as e:
        return await _again(page, ref, e, "revoke", (), "key")
    return done(f"/endpoints/{seg(ref)}")
