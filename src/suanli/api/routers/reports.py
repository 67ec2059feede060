"""Operator reports over time: revenue by day and what was sold, waste (idle GPU-hours) by hour."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import Field

from suanli.api.deps import caller, in_thread
from suanli.api.routers.admin import Admin
from suanli.api.schemas import Out, money
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.money import ZERO
from suanli.control.money import revenue
from suanli.control.scheduling import waste_history

router = APIRouter(route_class=StrictJSONRoute, prefix="/admin", tags=["admin"], dependencies=[Depends(caller)])


class RevenueDayOut(Out):
    day: str = Field(description="UTC day, YYYY-MM-DD")
    total: str = Field(description="net revenue of the day, exact")
    by: dict[str, str] = Field(description="GPU model (CPU: CPU-only work), else the transaction kind → net amount")


class RevenueOut(Out):
    currency: str
    total: str
    days: list[RevenueDayOut]


class WasteHourOut(Out):
    hour: datetime
    capacity_gpu_hours: float
    held_gpu_hours: float
    idle_gpu_hours: float
    idle_fraction: float | None
    waste_gpu_hours: str = Field(description="GPU-hours idle while work waited for GPUs (at most what it asked for)")
    held_idle_gpu_hours: str | None = Field(
        description="GPU-hours held by work but not busy, from the GPUs' readings; null: no readings that hour"
    )


@router.get("/revenue")
@in_thread
def revenue_by_day(ctx: Admin, days: Annotated[int, Query(ge=1, le=revenue.MAX_DAYS)] = 30) -> RevenueOut:
    """The `revenue` account's net entries by UTC day (oldest first) and by GPU model; exact decimal strings."""
    with ctx.db.read() as s:
        table = revenue.by_day(s, days, ctx.now)
    rows = [RevenueDayOut(day=d, total=money(sum(by.values(), start=ZERO)), by={k: money(v) for k, v in
                                                                                      sorted(by.items())})
            for d, by in table.items()]  # fmt: skip
    total = sum((v for by in table.values() for v in by.values()), start=ZERO)
    return RevenueOut(currency=ctx.srv.settings.currency, total=money(total), days=rows)


@router.get("/waste")
@in_thread
def waste_by_hour(ctx: Admin, hours: Annotated[int, Query(ge=1, le=waste_history.MAX_HOURS)] = 48
                  ) -> list[WasteHourOut]:  # fmt: skip
    """GPU-hours offered, held by work, left idle, wasted (idle while work waited) and held but not busy, per UTC
    hour, oldest first (the current hour up to now). docs/web.md defines each."""
    with ctx.db.read() as s:
        return [WasteHourOut(**h) for h in waste_history.by_hour(s, hours, ctx.now)]
