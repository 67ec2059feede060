"""Waste over time (idle GPU-hours by hour) and revenue (by day and GPU model), drawn with the vendored uPlot.

The figures are the API's (`GET /admin/waste`, `GET /admin/revenue`); the tables show the money exact (rounded to
cents only for display, as statements), the charts draw the same figures."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from markupsafe import Markup

from suanli.web.apicall import ApiError
from suanli.web.pages.ops_common import Operator, errors

router = APIRouter()


def _inline(data: Any) -> Markup:
    return Markup(json.dumps(data, separators=(",", ":"), default=str).replace("<", "\\u003c"))


@router.get("/ops/waste")
async def waste_page(page: Operator, hours: str = "48") -> Response:
    try:
        rows = await page.get("/admin/waste", hours=hours)
    except ApiError as e:
        if e.status != 422:
            raise
        return page.render(
            "ops/waste.html", status=422, rows=[], hours=hours, errors=errors(e, "hours"), data=_inline({})
        )
    data = {"t": [r["hour"] for r in rows], "series": {
        page.t("capacity", "总量"): [r["capacity_gpu_hours"] for r in rows],
        page.t("held by work", "已分配"): [r["held_gpu_hours"] for r in rows],
        page.t("idle", "闲置"): [r["idle_gpu_hours"] for r in rows],
        page.t("waste (idle while work waited)", "浪费（有任务排队时闲置）"): [r["waste_gpu_hours"] for r in rows],
        page.t("held, not busy", "已分配未使用"): [r["held_idle_gpu_hours"] for r in rows]}}  # fmt: skip
    idle = sum(r["idle_gpu_hours"] for r in rows)
    waste = sum((Decimal(r["waste_gpu_hours"]) for r in rows), start=Decimal(0))
    cap = sum(r["capacity_gpu_hours"] for r in rows)
    return page.render("ops/waste.html", rows=list(reversed(rows)), hours=hours, errors={}, data=_inline(data),
                       idle=idle, cap=cap, waste=waste)  # fmt: skip


@router.get("/ops/revenue")
async def revenue_page(page: Operator, days: str = "30") -> Response:
    try:
        body = await page.get("/admin/revenue", days=days)
    except ApiError as e:
        if e.status != 422:
            raise
        return page.render("ops/revenue.html", status=422, body=None, days=days, models=[], errors=errors(e, "days"),
                           data=_inline({}))  # fmt: skip
    models = sorted({k for d in body["days"] for k in d["by"]})
    data = {"t": [d["day"] + "T00:00:00Z" for d in body["days"]],
            "series": {page.t("total", "合计"): [d["total"] for d in body["days"]],
                       **{m: [d["by"].get(m, "0") for d in body["days"]] for m in models}}}  # fmt: skip
    return page.render("ops/revenue.html", body=body, days=days, models=models, errors={}, data=_inline(data))
