"""Reserved plans an organisation buys upfront and lists."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import Field

from suanli.api.deps import Auth, in_thread
from suanli.api.schemas import In, Out, money
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.accounts import accounts, memberships, spend_limits
from suanli.control.money import plans

router = APIRouter(route_class=StrictJSONRoute, tags=["plans"])


class PlanIn(In):
    plan: str = Field(min_length=1, max_length=32, description="a plan of the price book: hourly, daily, weekly…")
    gpu: str = Field(min_length=1, max_length=64)
    gpus: int = Field(ge=1, le=plans.MAX_PLAN_GPUS)
    key: str | None = Field(None, min_length=1, max_length=100, description="idempotency key; a retry buys once")


class PlanOut(Out):
    id: str
    org_id: str
    plan: str
    gpu_model: str
    gpus: int
    price: str
    starts_at: datetime
    ends_at: datetime
    active: bool


def _out(p: plans.Plan, now: datetime) -> PlanOut:
    return PlanOut(id=p.id, org_id=p.org_id, plan=p.plan, gpu_model=p.gpu_model, gpus=p.gpus, price=money(p.price),
                   starts_at=p.starts_at, ends_at=p.ends_at, active=p.starts_at <= now < p.ends_at)  # fmt: skip


@router.post("/orgs/{org_id}/plans", status_code=201)
@in_thread
def buy_plan(org_id: str, body: PlanIn, ctx: Auth) -> PlanOut:
    """Buy GPUs for a period, paid now from the balance (402 when it does not cover the price; 409 naming how many
    are left when the plans of that GPU model would hold more than its ready nodes have). Roles that spend only,
    within the buyer's monthly spend limit (403 naming `monthly_spend_limit`)."""
    with ctx.db.write() as s, s.begin():
        access = memberships.require(s, ctx.who, org_id, "spend")
        p = plans.buy(s, org_id, ctx.who.user_id, body.plan, body.gpu, body.gpus, ctx.now, body.key)
        spend_limits.check_spend(s, ctx.who, access, ctx.now)  # the purchase is charged already: over, it rolls back
        return _out(p, ctx.now)


@router.get("/orgs/{org_id}/plans")
@in_thread
def list_plans(org_id: str, ctx: Auth) -> list[PlanOut]:
    with ctx.db.read() as s:
        accounts.org_for(s, ctx.who, org_id)
        return [_out(p, ctx.now) for p in plans.of_org(s, org_id)]
