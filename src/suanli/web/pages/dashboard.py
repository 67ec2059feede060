"""The tenant's dashboard: balance, spend rate now, running workloads, and what needs attention."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from suanli.web import session
from suanli.web.session import Page

router = APIRouter()
Tenant = Annotated[Page, Depends(session.tenant)]
LOW_BALANCE_HOURS = Decimal(24)


async def _state(page: Page) -> dict[str, Any]:
    org = page.org["id"]
    balance = await page.get(f"/orgs/{org}/balance")
    live = await page.get("/workloads", org=org)
    running = [w for w in live if w["state"] == "running"]
    waiting = [w for w in live if w["state"] not in ("running",)]
    rate, left = Decimal(balance["held_per_hour"]), Decimal(balance["exact"])
    alerts: list[str] = []
    if rate > 0:
        hours = left / rate
        if hours < LOW_BALANCE_HOURS:
            alerts.append(page.t(f"Your balance covers about {hours:.1f} h at the current spend rate.",
                                 f"按当前消费速度，余额约可支撑 {hours:.1f} 小时。"))  # fmt: skip
    if left <= 0:
        alerts.append(page.t("Your balance is used up: new work cannot start until you top up.",
                             "余额已用尽：充值前无法启动新任务。"))  # fmt: skip
    return {"balance": balance, "running": running, "waiting": waiting, "alerts": alerts,
            "gpus_running": sum(w["gpus"] for w in running)}  # fmt: skip


@router.get("/")
async def dashboard(page: Tenant) -> Response:
    return page.render("dashboard.html", **await _state(page))


@router.get("/_/dashboard")
async def dashboard_cards(page: Tenant) -> Response:
    """The live part, polled by htmx every few seconds."""
    return page.render("_dashboard_cards.html", **await _state(page))
