"""Orgs and users, their quotas (`PUT /admin/orgs/{org}/quota`), and the price book with its plans (view, and edit
a GPU's on-demand price, the host prices and a plan through the admin price routes, each one new version of the
book with that one thing changed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.forms import as_int
from suanli.web.pages.account_forms import seg
from suanli.web.pages.ops_common import Operator, errors
from suanli.web.session import Page

router = APIRouter()
QUOTAS = ("gpus", "cpus", "memory_gib")


@router.get("/ops/orgs")
async def orgs_page(page: Operator) -> Response:
    orgs = await page.get("/admin/orgs", limit=10_000)
    users = await page.get("/admin/users", limit=10_000)
    return page.render("ops/orgs.html", orgs=orgs, users=users)


async def _quotas(page: Page, status: int = 200, **extra: Any) -> Response:
    orgs = await page.get("/admin/orgs", limit=10_000)
    return page.render("ops/quotas.html", status=status, orgs=orgs, **{"errors": {}, "failed": None, **extra})


@router.get("/ops/quotas")
async def quotas_page(page: Operator) -> Response:
    return await _quotas(page)


@router.post("/ops/quotas/{org}")
async def set_quota(org: str, request: Request, page: Operator) -> Response:
    """Every quota of the form: a whole number, or empty for no limit."""
    data = await session.form(request, page)
    body = {k: (None if not (data.get(k) or "").strip() else as_int(data.get(k))) for k in QUOTAS}
    try:
        await page.api("PUT", f"/admin/orgs/{seg(org)}/quota", json=body)
    except ApiError as e:
        return await _quotas(page, status=e.status, errors=errors(e, "gpus"), failed=org)
    return RedirectResponse("/ops/quotas", status_code=303)


async def _prices(page: Page, status: int = 200, **extra: Any) -> Response:
    book = await page.get("/prices")
    return page.render("ops/prices.html", status=status, book=book, **{"errors": {}, "form": {}, **extra})


@router.get("/ops/prices")
async def prices_page(page: Operator) -> Response:
    return await _prices(page)


@router.post("/ops/prices/gpu")
async def set_gpu_price(request: Request, page: Operator) -> Response:
    """A GPU model's on-demand price per GPU-hour (a new version of the book); `remove` stops offering it."""
    data = await session.form(request, page)
    gpu = (data.get("gpu") or "").strip()
    body: dict[str, Any] = (
        {"remove": True} if data.get("remove") else {"on_demand": (data.get("on_demand") or "").strip()}
    )
    try:
        if not gpu:
            raise ApiError(422, "gpu: name the GPU model")
        await page.api("PUT", f"/admin/prices/gpus/{seg(gpu)}", json=body)
    except ApiError as e:
        return await _prices(page, status=e.status, errors=errors(e, "on_demand"), form=data)
    return RedirectResponse("/ops/prices", status_code=303)


@router.post("/ops/prices/host")
async def set_host_prices(request: Request, page: Operator) -> Response:
    data = await session.form(request, page)
    body = {k: (data.get(k) or "").strip() for k in ("cpu_core_hour", "memory_gib_hour")}
    try:
        await page.api("PUT", "/admin/prices/host", json=body)
    except ApiError as e:
        return await _prices(page, status=e.status, errors=errors(e, "cpu_core_hour"), form=data)
    return RedirectResponse("/ops/prices", status_code=303)


@router.post("/ops/prices/plan")
async def set_plan(request: Request, page: Operator) -> Response:
    """Add or change a plan (hours, discount as typed: an exact decimal string), or retire it (`retire`), through
    the plan's own route: one new version of the book with that plan changed, whatever other edits are made at the
    same time. Plans bought keep their terms; a retired plan is no longer sold."""
    data = await session.form(request, page)
    name = (data.get("name") or "").strip()
    try:
        if not name:
            raise ApiError(422, "name: name the plan")
        if data.get("retire"):
            await page.api("DELETE", f"/admin/prices/plans/{seg(name)}")
        else:
            body = {"hours": as_int(data.get("hours")), "discount": (data.get("discount") or "").strip()}
            await page.api("PUT", f"/admin/prices/plans/{seg(name)}", json=body)
    except ApiError as e:  # no such plan to retire is the form's error at the name, as the others
        status = 422 if e.status == 404 else e.status
        return await _prices(page, status=status, errors=errors(e, "name"), form=data)
    return RedirectResponse("/ops/prices", status_code=303)
