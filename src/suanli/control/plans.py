"""Reserved plans: GPUs held for a period (hour, day, week, month), paid upfront at the plan's discount.

Buying a plan is one `plan_purchase` ledger transaction (org → revenue) that may not take the balance below
zero, and a plan row with its period. Its idempotency key comes from the caller, so a retried purchase buys
once. Workloads billed `plan:<id>` run on the plan's GPUs without per-second charges while it is active.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from suanli import catalog
from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.control import ledger, prices
from suanli.control.errors import Conflict, Invalid, NotFound
from suanli.control.ids import new_id
from suanli.db.models import Plan

__all__ = ["Plan", "buy", "get", "of_org"]

MAX_PLAN_GPUS = 100_000


def buy(
    s: Session, org_id: str, user_id: str, plan: str, gpu: str, gpus: int, now: datetime, key: str | None = None
) -> Plan:
    try:
        model = catalog.gpu(gpu).name
    except catalog.CatalogError as e:
        raise Invalid(f"gpu: {e}") from e
    if not 1 <= gpus <= MAX_PLAN_GPUS:
        raise Invalid(f"gpus: 1..{MAX_PLAN_GPUS}")
    _, book = prices.current(s)
    if plan not in book.plans:
        raise Invalid(f"plan: one of {', '.join(book.plans) or '(none offered)'}")
    if model not in book.gpu_hour:
        raise Invalid(f"gpu: {model} is not for rent (no price)")
    price = book.plan_price(plan, model, gpus)
    plan_id = new_id("plan")
    tx_key = f"plan:{org_id}:{key}" if key else f"plan:{plan_id}"
    existing = s.scalar(select(Plan).where(Plan.purchase_key == tx_key))
    if existing is not None:  # a retried purchase: the plan the first attempt bought
        return _bought(existing, plan, model, gpus, key)
    memo = f"{plan} plan: {gpus} x {model}"
    if price > 0:
        ledger.post(s, transfer(tx_key, "plan_purchase", org_account(org_id), REVENUE, price, memo), now,
                    org_id=org_id, user_id=user_id)  # fmt: skip
    row = Plan(id=plan_id, org_id=org_id, user_id=user_id, plan=plan, gpu_model=model, gpus=gpus, price=price,
               purchase_key=tx_key, starts_at=now, ends_at=now + timedelta(hours=book.plans[plan].hours),
               created_at=now)  # fmt: skip
    try:
        with s.begin_nested():
            s.add(row)
            s.flush()
    except IntegrityError:
        # The same key raced in and committed first (on PostgreSQL this insert, or the ledger post's, waited for it;
        # the ledger post then found the same transaction already there): answer with the plan it bought.
        existing = s.scalar(select(Plan).where(Plan.purchase_key == tx_key))
        if existing is None:
            raise
        return _bought(existing, plan, model, gpus, key)
    return row


def _bought(existing: Plan, plan: str, model: str, gpus: int, key: str | None) -> Plan:
    if (existing.plan, existing.gpu_model, existing.gpus) != (plan, model, gpus):
        raise Conflict(f"key: {key!r} was already used to buy a different plan")
    return existing


def of_org(s: Session, org_id: str) -> list[Plan]:
    return list(s.scalars(select(Plan).where(Plan.org_id == org_id).order_by(Plan.created_at.desc())))


def get(s: Session, org_id: str, plan_id: str) -> Plan:
    row = s.get(Plan, plan_id)
    if row is None or row.org_id != org_id:
        raise NotFound(f"plan {plan_id} not found")
    return row
