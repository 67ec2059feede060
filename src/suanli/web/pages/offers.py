"""What is for rent: per GPU model the total, the free, the largest free NVLink and leaf blocks, prices on demand,
spot, by plan and by usage (what `suanli offers` prints, from `/offers` and `/prices`), and a quote form
(model, precision, tokens → time and cost per offer, from `POST /quotes`, as `suanli quote`)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from suanli.perf import MODEL_PRESETS
from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.forms import as_int
from suanli.web.session import Page

router = APIRouter()
Tenant = Annotated[Page, Depends(session.tenant)]
PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
MODES = ("on-demand", "spot", "usage")
QUOTE_FIELDS = ("model", "precision", "tokens", "gpu", "gpus", "billing_mode")


def _number(text: str) -> float | str:
    """`2e9`, `2000000000` or `2,000,000,000` as a number; anything else as typed, for the API to name."""
    try:
        d = Decimal(text.replace(",", "").replace("_", "").strip()[:64])
    except InvalidOperation:
        return text[:64]
    if not d.is_finite() or abs(d) > Decimal("1e300"):  # float() would be inf: not JSON, so the API's message
        return text[:64]
    return float(d)


async def _render(page: Page, status: int = 200, **ctx: Any) -> Response:
    offers = await page.get("/offers")
    book = await page.get("/prices")
    ctx.setdefault("form", {"model": "llama3.1-8b", "precision": "bf16", "tokens": "1e9", "gpu": "any",
                            "gpus": "", "billing_mode": "on-demand"})  # fmt: skip
    ctx.setdefault("quotes", None)
    ctx.setdefault("errors", {})
    return page.render("work/offers.html", status=status, offers=offers, book=book, models=list(MODEL_PRESETS),
                       precisions=PRECISIONS, modes=MODES, **ctx)  # fmt: skip


@router.get("/offers")
async def offers_page(page: Tenant) -> Response:
    return await _render(page)


@router.post("/offers/quote")
async def quote(request: Request, page: Tenant) -> Response:
    """Time and cost of training `tokens` of a model on each feasible offer; the API's 422 at its field."""
    data = await session.form(request, page)
    form = {k: data.get(k, "").strip()[:64] for k in QUOTE_FIELDS}
    body: dict[str, Any] = {"model": form["model"], "precision": form["precision"] or "bf16",
                            "tokens": _number(form["tokens"]), "gpu": form["gpu"] or "any",
                            "billing_mode": form["billing_mode"] or "on-demand"}  # fmt: skip
    if form["gpus"]:
        body["gpus"] = as_int(form["gpus"])
    try:
        rows = (await page.api("POST", "/quotes", json=body)).json()
    except ApiError as e:
        if e.status >= 500:
            raise
        errors = e.fields()
        head, sep, msg = e.detail.partition(": ")
        if sep and head in QUOTE_FIELDS:
            errors.setdefault(head, msg)
        return await _render(page, status=e.status, form=form, errors=errors or {"_": e.detail})
    return await _render(page, form=form, quotes=rows)
