"""What an org has committed to pay for, counted before the scheduler hands out GPUs.

Admission lets work start only while the org's balance covers `admission_hold_minutes` of the hourly rate of all it
runs, the new work too. A submission is checked against what the org runs, not what it has queued, so a tenant can
queue far more than it can pay for; if the scheduler saw all of it, each pass would hand free GPUs to work that
admission then refuses, and the work of other orgs behind it would wait at idle GPUs. So before each cycle every
org's queue is walked in its own order (class, then its place in the queue), adding each workload's rate to what it
runs: work that still fits the hold goes to the scheduler, the rest waits for balance with the figures, and is not
counted (it does not block the org's smaller work behind it, nor anyone else's). Work whose rate is zero (a plan's
prepaid GPUs, with no host CPU or memory) costs the org nothing more and always goes to the scheduler.

A queued workload's rate is what placing it could cost at most: its GPU count at the dearest of the GPU models it
may run on, plus its host CPU and memory as if each GPU were on a node of its own (the most the per-node rounding
of its share can come to). So admission at placement, which checks the exact rate, never refuses what passed here
(unless the balance changed meanwhile).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.billing.ledger import org_account
from suanli.billing.money import ZERO, exact, shown
from suanli.billing.prices import PriceBook
from suanli.db.models import AccountBalance, Allocation
from suanli.sched import Request
from suanli.sched.state import host_share
from suanli.workloads.spec import WorkloadSpec

SIGNS = {"CNY": "¥", "USD": "$", "EUR": "€"}
WAITING = "waiting for balance"


@dataclass(frozen=True)
class OrgMoney:
    balance: Decimal
    rate: Decimal  # per hour, of everything it runs now


def org_money(s: Session, org_ids: Iterable[str]) -> dict[str, OrgMoney]:
    """Balance and running hourly rate of each org (an org without a ledger account has 0): two statements per 500
    orgs."""
    ids = sorted(set(org_ids))
    balances: dict[str, Decimal] = {}
    rates: dict[str, Decimal] = {}
    for i in range(0, len(ids), 500):
        part = ids[i : i + 500]
        accounts = {org_account(o): o for o in part}
        for account, balance in s.execute(
            select(AccountBalance.account, AccountBalance.balance).where(AccountBalance.account.in_(list(accounts)))
        ):
            balances[accounts[account]] = exact(Decimal(balance))
        for org, rate in s.execute(
            select(Allocation.org_id, func.sum(Allocation.rate_per_hour))
            .where(Allocation.org_id.in_(part), Allocation.stopped_at.is_(None))
            .group_by(Allocation.org_id)
        ):
            rates[org] = exact(Decimal(rate or 0))
    return {o: OrgMoney(balances.get(o, ZERO), rates.get(o, ZERO)) for o in ids}


def money_text(amount: Decimal, currency: str) -> str:
    """¥10.00, -¥3.00; `12.00 XYZ` for a currency without a sign."""
    sign = SIGNS.get(currency)
    if sign is None:
        return f"{shown(amount)} {currency}"
    return f"-{sign}{shown(-amount)}" if amount < 0 else f"{sign}{shown(amount)}"


def most_rate(spec: WorkloadSpec, gpus: int, models: Iterable[str], book: PriceBook) -> Decimal:
    """The most an allocation of `gpus` GPUs of this workload can cost an hour (see the module docstring)."""
    mode = spec.billing_mode()
    gpu_rate = ZERO
    if gpus > 0 and spec.plan_id() is None:
        allowed = spec.gpu_preference()
        fleet = set(models)
        candidates = [m for m in (allowed or sorted(fleet)) if m in fleet and m in book.gpu_hour]
        if candidates:
            gpu_rate = max(book.rate(m, gpus, mode, spec.milli()) for m in candidates)  # type: ignore[arg-type]
    if gpus > 0:
        cpu, mem = spec.resources.cpu_milli(), spec.resources.memory_mib()
        cpu, mem = gpus * host_share(cpu, 1, gpus), gpus * host_share(mem, 1, gpus)
    else:
        cpu, mem = spec.host_request()
    host = book.host_rate(cpu, mem, "spot" if mode == "spot" else "on-demand") if cpu or mem else ZERO
    return exact(gpu_rate + host)


def affordable(
    queue: Sequence[Request],
    specs: Mapping[str, WorkloadSpec],
    money: Mapping[str, OrgMoney],
    book: PriceBook,
    models: Iterable[str],
    hold_minutes: int,
) -> tuple[list[Request], dict[str, str]]:
    """The queued requests the scheduler may place (in the queue's order), and why each other one waits."""
    fleet = frozenset(models)
    by_org: dict[str, list[Request]] = defaultdict(list)
    for r in queue:
        by_org[r.tenant].append(r)
    waits: dict[str, str] = {}
    for org, reqs in by_org.items():
        have = money.get(org, OrgMoney(ZERO, ZERO))
        committed = have.rate
        for r in sorted(reqs, key=lambda r: (-r.rank, r.submit_time, r.id)):
            spec = specs.get(r.id)
            rate = most_rate(spec, r.gpus, fleet, book) if spec is not None else ZERO
            if rate == ZERO:
                continue
            need = exact((committed + rate) * hold_minutes / 60)
            if have.balance < need:
                waits[r.id] = (f"{WAITING}: org has {money_text(have.balance, book.currency)}, its running and queued "
                               f"work needs {money_text(need, book.currency)}")  # fmt: skip
                continue
            committed += rate
    if not waits:
        return list(queue), waits
    return [r for r in queue if r.id not in waits], waits
