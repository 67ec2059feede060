"""Reserved plans: GPUs held for a period (hour, day, week, month), paid upfront at the plan's discount.

Buying a plan is one `plan_purchase` ledger transaction (org → revenue) that may not take the balance below
zero, and a plan row with its period. Its idempotency key comes from the caller, so a retried purchase buys
once. Workloads billed `plan:<id>` run on the plan's GPUs without per-second charges while it is active.

A plan reserves capacity that exists when it starts: the plans of a GPU model whose periods overlap, with the GPUs
running on-demand work holds (it is not stopped for a plan), never take more GPUs than the model's ready nodes have
(a purchase over that is a 409 saying how many are left); spot work's GPUs count as free, as it gives way to a plan's
work. Offers count the GPUs reserved and not in use by their plan's work as taken, and the scheduling pass holds them
back from other work (`reservations`). Purchases queue on one lock row (`kv` `plans_version`, bumped first: a row lock
on PostgreSQL, the write lock on SQLite), so two cannot both take the last GPUs, and a retried key waits for the
purchase it repeats and finds its plan; a pass's placements take that row shared (`locked_version`), so a purchase
never counts GPUs that a placement written meanwhile takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from suanli import catalog
from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.control.errors import Conflict, Invalid, NotFound
from suanli.control.ids import new_id
from suanli.control.money import ledger, prices
from suanli.db.models import Allocation, KeyValue, Node, Plan, Workload
from suanli.workloads.spec import WorkloadSpec

__all__ = ["PLANS_VERSION", "Plan", "Reservations", "busy", "buy", "capacity", "get", "locked_version", "of_org",
           "reservations", "reserved", "version"]  # fmt: skip

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


def version(s: Session) -> int:
    """The plans' version: every purchase bumps it."""
    return int(s.scalar(select(KeyValue.value).where(KeyValue.key == PLANS_VERSION)) or 0)


def locked_version(s: Session) -> int:
    """The plans' version, the row locked shared until the transaction ends (PostgreSQL; on SQLite the write lock
    does it): a purchase, which bumps it first, waits for this transaction, and this one sees any purchase before it."""
    if s.get_bind().dialect.name != "postgresql":
        return version(s)
    q = select(KeyValue.value).where(KeyValue.key == PLANS_VERSION).with_for_update(read=True)
    value = s.scalar(q)
    if value is None:  # no plan was ever bought: the row to lock is made (a purchase racing this waits for it)
        s.execute(pg_insert(KeyValue).values(key=PLANS_VERSION, value=0).on_conflict_do_nothing(index_elements=["key"]))
        value = s.scalar(q)
    return int(value or 0)


def busy(s: Session, model: str) -> int:
    """GPUs of `model` on ready nodes that running on-demand work holds (work of no plan, not spot): a plan starting
    now cannot have them. Elastic work counts at the GPUs it asked for (what it grew into it gives back when work
    waits), unless its owner scaled it."""
    ready = set(s.scalars(select(Node.name).where(Node.gpu_model == model, Node.state == "ready")))
    rows = s.execute(
        select(Allocation.placement, Workload.spec, Workload.scale_to)
        .outerjoin(Workload, Workload.id == Allocation.workload)
        .where(Allocation.gpu_model == model, Allocation.stopped_at.is_(None), Allocation.billing_mode != "spot",
               Allocation.billing_mode.not_like("plan:%"))
    )  # fmt: skip
    total = 0
    for placement, spec, scale_to in rows:
        held = sum(len(g) for node, g in (placement or {}).items() if node in ready)
        lo_hi = WorkloadSpec.model_validate(spec).gpu_range() if spec and scale_to is None else None
        total += min(held, lo_hi[0]) if lo_hi else held
    return total


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
    have, held, running = capacity(s, model), reserved(s, model, now, ends), busy(s, model)
    if held + running + gpus > have:
        left = max(0, have - held - running)
        raise Conflict(f"gpus: {gpus} x {model} asked; {left} of the {have} {model} GPUs in service are left to "
                       f"reserve until {ends:%Y-%m-%d %H:%M} UTC ({held} reserved by plans, {running} held by running "
                       "on-demand work, which a plan does not stop)")  # fmt: skip
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
    """Plans active at one moment, per GPU model: GPUs reserved, and of those held by no work of their plan (in all,
    and per org: what the scheduling pass holds back for that org's plan work; 0 for a plan all in use)."""

    reserved: dict[str, int]
    idle: dict[str, int]
    until: datetime | None  # when the first of them ends (the counts change then); None: no active plan
    idle_by_org: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> org -> GPUs


def reservations(s: Session, now: datetime) -> Reservations:
    active = s.execute(select(Plan.id, Plan.org_id, Plan.gpu_model, Plan.gpus, Plan.ends_at)
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
    by_org: dict[str, dict[str, int]] = {}
    for p in active:
        left = max(0, p.gpus - int(in_use.get(f"plan:{p.id}") or 0))
        held[p.gpu_model] = held.get(p.gpu_model, 0) + p.gpus
        idle[p.gpu_model] = idle.get(p.gpu_model, 0) + left
        mine = by_org.setdefault(p.gpu_model, {})
        mine[p.org_id] = mine.get(p.org_id, 0) + left
    return Reservations(held, idle, min(p.ends_at for p in active), by_org)


def of_org(s: Session, org_id: str) -> list[Plan]:
    return list(s.scalars(select(Plan).where(Plan.org_id == org_id).order_by(Plan.created_at.desc())))


def get(s: Session, org_id: str, plan_id: str) -> Plan:
    row = s.get(Plan, plan_id)
    if row is None or row.org_id != org_id:
        raise NotFound(f"plan {plan_id} not found")
    return row
