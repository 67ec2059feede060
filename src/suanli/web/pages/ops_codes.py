"""Top-up codes: generate a batch (amount, count, expiry, note, optionally one org), print its plain codes on a page
shown once (the API keeps only their SHA-256), list batches and see which codes were redeemed, void the rest."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from suanli.web import once, session
from suanli.web.apicall import ApiError
from suanli.web.forms import as_int
from suanli.web.pages.account_forms import seg
from suanli.web.pages.ops_common import Operator, error_page, errors
from suanli.web.session import Page

router = APIRouter()
CODES = "/admin/topup-codes"


async def _list(page: Page, status: int = 200, **extra: Any) -> Response:
    batches = await page.get(CODES, limit=200)
    return page.render("ops/codes.html", status=status, batches=batches, **{"errors": {}, "form": {}, **extra})


@router.get("/ops/codes")
async def codes_page(page: Operator) -> Response:
    return await _list(page)


@router.post("/ops/codes")
async def create_batch(request: Request, page: Operator) -> Response:
    """The printable sheet of the new codes is the batch's page right after this answer's redirect, once (held in
    the database until then, web/once.py); the API keeps only their hashes."""
    data = await session.form(request, page)
    body: dict[str, Any] = {"amount": (data.get("amount") or "").strip(), "count": as_int(data.get("count")),
                            "note": data.get("note", "")}  # fmt: skip
    if (data.get("expires_at") or "").strip():
        body["expires_at"] = data["expires_at"].strip()
    if (data.get("org") or "").strip():
        body["org"] = data["org"].strip()
    try:
        made = (await page.api("POST", CODES, json=body)).json()
    except ApiError as e:
        return await _list(page, status=e.status, errors=errors(e, "amount"), form=data)

    async def sheet() -> Response:
        return _sheet(page, made)

    return await once.redirect(page, f"/ops/codes/{seg(made['batch']['id'])}", made, sheet)


def _sheet(page: Page, made: dict[str, Any]) -> Response:
    """A new batch's printable sheet: its codes, shown once."""
    return page.render("ops/codes_print.html", batch=made["batch"], codes=made["codes"])


@router.get("/ops/codes/{batch}")
async def batch_page(batch: str, page: Operator) -> Response:
    """The batch with its codes' states; right after it was made, its printable sheet instead, this once."""
    made = await once.take(page, f"/ops/codes/{seg(batch)}")
    if made is not None:
        return _sheet(page, made)
    try:
        b = await page.get(f"{CODES}/{seg(batch)}")
    except ApiError as e:
        if e.status in (404, 422):
            return error_page(page, 404, e.detail)
        raise
    return page.render("ops/codes_batch.html", batch=b)


@router.post("/ops/codes/{batch}/void")
async def void_batch(batch: str, request: Request, page: Operator) -> Response:
    """Void every unredeemed code of the batch."""
    await session.form(request, page)
    try:
        await page.api("POST", f"{CODES}/{seg(batch)}/void", json={})
    except ApiError as e:
        return error_page(page, e.status, e.detail)
    return RedirectResponse(f"/ops/codes/{seg(batch)}", status_code=303)
