"""Reserved plans: GPUs held for a period (hour, day, week, month), paid upfront at the plan's discount.

Buying a plan is one `plan_purchase` ledger transaction (org → revenue) that may not take the balance below
zero, and a plan row with its period. Its idempotency key comes from the caller, so a retried purchase buys
once. Workloads billed `plan:<id>` run on the plan's GPUs without per-second charges while it is active.

A plan reserves capacity that exists: the plans of a GPU model whose periods overlap never hold more GPUs than the
model's ready nodes have (a purchase over that is a 409 saying how many are left), and offers count the GPUs
reserved and not in use by their plan's work as taken. Purchases queue on one lock row (`kv` `plans_version`,
bumped first: a row lock on PostgreSQL, the write lock on SQLite), so two cannot both take the last GPUs, and a
retried key waits for the purchase it repeats and finds its plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from suanli import catalog
from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.control import ledger, prices
from suanli.control.errors import Conflict, Invalid, NotFound
from suanli.control.ids import new_id
from suanli.db.models import Allocation, KeyValue, Node, Plan

__all__ = ["PLANS_VERSION", "Plan", "Reservations", "buy", "capacity", "get", "of_org", "reservations", "reserved"]

MAX_PLAN_GPUS = 100_000
PLANS_VERSION = "plans_version"  # bumped by every purchase: its lock serialises them, offers' caches key on it


def _lock(s: Session) -> None:
    """Take the purchase lock (one atomic upsert: the row need not exist) until the transaction ends."""
    ins = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    stmt = ins(KeyValue).values(key=PLANS_VERSION, value=1)
    s.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": KeyValue.value + 1}))


def capacity(s: Session, model: str) -> int:
    """GPUs of `model` on ready nodes: what plans may reserve (draining and down nodes take no new work)."""
    total = s.scalar(select(func.coalesce(func.sum(Node.gpu_count), 0))
                     .where(Node.gpu_model == model, Node.state == "ready"))  # fmt: skip
    return int(total or 0)


def reserved(s: Session, model: str, start: datetime, end: datetime) -> int:
    """GPUs of `model` reserved by plans whose periods overlap [start, end)."""
    total = s.scalar(select(func.coalesce(func.sum(Plan.gpus), 0))
                     .where(Plan.gpu_model == model, Plan.starts_at < end, Plan.ends_at > start))  # fmt: skip
    return int(total or 0)


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
    _lock(s)  # from here on, no other purchase runs: what is read below stays true until this one commits
    existing = s.scalar(select(Plan).where(Plan.purchase_key == tx_key))
    if existing is not None:  # a retried purchase: the plan the first attempt bought
        if (existing.plan, existing.gpu_model, existing.gpus) != (plan, model, gpus):
            raise Conflict(f"key: {key!r} was already used to buy a different plan")
        return existing
    ends = now + timedelta(hours=book.plans[plan].hours)
    have, held = capacity(s, model), reserved(s, model, now, ends)
    if held + gpus > have:
        left = max(0, have - held)
        raise Conflict(f"gpus: {gpus} x {model} asked; {left} of the {have} {model} GPUs in service are left to "
                       f"reserve until {ends:%Y-%m-%d %H:%M} UTC ({held} reserved by plans)")  # fmt: skip
    memo = f"{plan} plan: {gpus} x {model}"
    if price > 0:
        ledger.post(s, transfer(tx_key, "plan_purchase", org_account(org_id), REVENUE, price, memo), now,
                    org_id=org_id, user_id=user_id)  # fmt: skip
    row = Plan(id=plan_id, org_id=org_id, user_id=user_id, plan=plan, gpu_model=model, gpus=gpus, price=price,
               purchase_key=tx_key, starts_at=now, ends_at=ends, created_at=now)  # fmt: skip
    s.add(row)
    s.flush()
    return row


@dataclass(frozen=True)
class Reservations:
    """Plans active at one moment, per GPU model: GPUs reserved, and of those held by no work of their plan."""

    reserved: dict[str, int]
    idle: dict[str, int]
    until: datetime | None  # when the first of them ends (the counts change then); None: no active plan


def reservations(s: Session, now: datetime) -> Reservations:
    active = s.execute(select(Plan.id, Plan.gpu_model, Plan.gpus, Plan.ends_at)
                       .where(Plan.starts_at <= now, Plan.ends_at > now)).all()  # fmt: skip
    if not active:
        return Reservations({}, {}, None)
    in_use = dict(
        s.execute(
            select(Allocation.billing_mode, func.sum(Allocation.gpus))
            .where(Allocation.billing_mode.in_([f"plan:{p.id}" for p in active]), Allocation.stopped_at.is_(None))
            .group_by(Allocation.billing_mode)
        ).all()
    )
    held: dict[str, int] = {}
    idle: dict[str, int] = {}
    for p in active:
        held[p.gpu_model] = held.get(p.gpu_model, 0) + p.gpus
        idle[p.gpu_model] = idle.get(p.gpu_model, 0) + max(0, p.gpus - int(in_use.get(f"plan:{p.id}") or 0))
    return Reservations(held, idle, min(p.ends_at for p in active))


def of_org(s: Session, org_id: str) -> list[Plan]:
    return list(s.scalars(select(Plan).where(Plan.org_id == org_id).order_by(Plan.created_at.desc())))


def get(s: Session, org_id: str, plan_id: str) -> Plan:
    row = s.get(Plan, plan_id)
    if row is None or row.org_id != org_id:
        raise NotFound(f"plan {plan_id} not found")
    return row
