"""What an org has committed to pay for, counted before the scheduler hands out GPUs.

Admission lets work start only while the org's balance covers `admission_hold_minutes` of the hourly rate of all it
runs, the new work too. A submission is checked against what the org runs, not what it has queued, so a tenant can
queue far more than it can pay for; if the scheduler saw all of it, each pass would hand free GPUs to work that
admission then refuses, and the work of other orgs behind it would wait at idle GPUs. So before each cycle every
org's queue is walked in its own order (class, then its place in the queue), adding each workload's rate to what it
runs: work that still fits the hold goes to the scheduler, the rest waits for balance with the figures, and is not
counted (it does not block the org's smaller work behind it, nor anyone else's). Work whose rate is zero (a plan's
prepaid GPUs, with no host CPU or memory) costs the org nothing more and always goes to the scheduler. A member's
monthly spend limit is walked the same way: their work whose hold would take their month's charges past it waits
("waiting for spend limit"), unseen by the scheduler, so the placement check of the limit never leaves GPUs idle
while others' work waits.

A queued workload's rate is what placing it could cost at most: its GPU count at the dearest of the GPU models it
may run on, plus its host CPU and memory as if each GPU were on a node of its own (the most the per-node rounding
of its share can come to). So admission at placement, which checks the exact rate, never refuses what passed here
(unless the balance changed meanwhile).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.billing.ledger import org_account
from suanli.billing.money import INTERNAL, ZERO, exact, shown
from suanli.billing.prices import PriceBook
from suanli.control.accounts import spend_limits
from suanli.control.money import prices
from suanli.db.models import AccountBalance, Allocation, Membership, Org
from suanli.sched import Request
from suanli.sched.state import host_share
from suanli.workloads.spec import WorkloadSpec

SIGNS = {"CNY": "¥", "USD": "$", "EUR": "€"}
WAITING = "waiting for balance"
LIMITED = "waiting for spend limit"


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


@dataclass(frozen=True)
class MemberMoney:
    """A member's monthly spend limit in a team org, their charges this month and the rate of their running work."""

    limit: Decimal
    spent: Decimal
    rate: Decimal


def member_money(s: Session, members: Iterable[tuple[str, str]], now: datetime) -> dict[tuple[str, str], MemberMoney]:
    """`MemberMoney` of those (org, user) pairs with a limit in a team org (personal orgs have none, as at
    submission): one statement per 500 orgs, then two per member with a limit."""
    wanted = set(members)
    orgs = sorted({o for o, _ in wanted})
    out: dict[tuple[str, str], MemberMoney] = {}
    for i in range(0, len(orgs), 500):
        rows = s.execute(
            select(Membership.org_id, Membership.user_id, Membership.monthly_spend_limit)
            .join(Org, Org.id == Membership.org_id)
            .where(Membership.org_id.in_(orgs[i : i + 500]), Membership.monthly_spend_limit.is_not(None),
                   Org.personal.is_(False))
        )  # fmt: skip
        for org, user, limit in rows:
            if (org, user) in wanted:
                spent = spend_limits.month_to_date(s, org, now, user).get(user, ZERO)
                out[(org, user)] = MemberMoney(exact(Decimal(limit)), spent, spend_limits.running_rate(s, org, user))
    return out


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
    rates: dict[tuple[str, int], int] | None = None,
    users: Mapping[str, str] | None = None,
    members: Mapping[tuple[str, str], MemberMoney] | None = None,
) -> tuple[list[Request], dict[str, str]]:
    """The queued requests the scheduler may place (in the queue's order), and why each other one waits. `rates`
    keeps each request's most rate (in units of 1e-8) between calls: the caller empties it when the book or the GPU
    models change. Sums and comparisons are in those integer units, exact, and unrounded: never more lenient than
    admission's rounded hold. `users` (workload -> user) and `members` (`member_money`): members' spend limits,
    walked like the balance."""
    fleet = frozenset(models)
    users, members = users or {}, members or {}
    rates = {} if rates is None else rates
    by_org: dict[str, list[tuple[Request, int]]] = defaultdict(list)
    for r in queue:
        rate = rates.get((r.id, r.gpus))
        if rate is None:
            spec = specs.get(r.id)
            rate = rates[(r.id, r.gpus)] = _units(most_rate(spec, r.gpus, fleet, book)) if spec is not None else 0
        by_org[r.tenant].append((r, rate))
    waits: dict[str, str] = {}
    limited = {o for o, _ in members}
    for org, reqs in by_org.items():
        have = money.get(org, OrgMoney(ZERO, ZERO))
        room = _units(have.balance) * 60  # what the balance covers, in unit-minutes
        committed = _units(have.rate)
        if org not in limited and room >= (committed + sum(rate for _, rate in reqs)) * hold_minutes:
            continue  # it can pay for all of it
        said: dict[int, str] = {}
        spending: dict[str, int] = {}  # a limited member's running and walked work, in units
        for r, rate in sorted(reqs, key=lambda x: (-x[0].rank, x[0].submit_time, x[0].id)):
            if rate == 0:
                continue
            member = members.get((org, users.get(r.id, "")))
            if member is not None:
                user = users[r.id]
                mine = spending.setdefault(user, _units(member.rate))
                if _units(member.limit - member.spent) * 60 < (mine + rate) * hold_minutes:
                    amount = exact(Decimal(mine + rate) * INTERNAL * hold_minutes / 60)
                    waits[r.id] = (f"{LIMITED}: the member's monthly_spend_limit is "
                                   f"{money_text(member.limit, book.currency)}, {money_text(member.spent, book.currency)}"
                                   " is charged this month, and their running and queued work holds "
                                   f"{money_text(amount, book.currency)}")  # fmt: skip
                    continue
            if room < (committed + rate) * hold_minutes:
                need = committed + rate
                if need not in said:
                    amount = exact(Decimal(need) * INTERNAL * hold_minutes / 60)
                    said[need] = (f"{WAITING}: org has {money_text(have.balance, book.currency)}, its running and "
                                  f"queued work needs {money_text(amount, book.currency)}")  # fmt: skip
                waits[r.id] = said[need]
                continue
            committed += rate
            if member is not None:
                spending[users[r.id]] += rate
    if not waits:
        return list(queue), waits
    return [r for r in queue if r.id not in waits], waits


def _units(amount: Decimal) -> int:
    """An exact amount (to 1e-8) as an integer count of 1e-8."""
    return int(amount.scaleb(8))


@dataclass
class Affordability:
    """What a scheduling pass keeps between passes to count commitments cheaply: the price book by version, each
    queued request's most rate, and which orgs' work waited for balance (a change of their balance is a reason to
    run the next pass)."""

    short: set[str] = field(default_factory=set)  # orgs whose work waited for balance in the last pass
    held: set[tuple[str, str]] = field(default_factory=set)  # members whose work waited for their spend limit
    _book: tuple[int, PriceBook] | None = None
    _rates: dict[tuple[str, int], int] = field(default_factory=dict)
    _rates_for: tuple[int, frozenset[str]] | None = None  # (book version, GPU models) the rates are for
    _money: dict[str, OrgMoney] = field(default_factory=dict)
    _members: dict[tuple[str, str], MemberMoney] = field(default_factory=dict)

    def signature(self, s: Session) -> int:
        """Changes when the balance of an org whose work waits for balance changes (a top-up), or the limit of a
        member whose work waits for it."""
        if not self.short and not self.held:
            return 0
        limits = []
        if self.held:
            orgs = sorted({o for o, _ in self.held})
            rows = s.execute(select(Membership.org_id, Membership.user_id, Membership.monthly_spend_limit)
                             .where(Membership.org_id.in_(orgs)))  # fmt: skip
            limits = sorted((o, u, str(lim)) for o, u, lim in rows if (o, u) in self.held)
        balances = tuple((o, m.balance) for o, m in sorted(org_money(s, self.short).items())) if self.short else ()
        return hash((balances, tuple(limits)))

    def read(self, s: Session, org_ids: Iterable[str], members: Iterable[tuple[str, str]] = (),
             now: datetime | None = None) -> None:  # fmt: skip
        """What the pass needs from the database: the orgs' balances and running rates, the spend limits of the
        members (org, user) with queued work and what counts against them this month (at `now`), and the price
        book."""
        self._money = org_money(s, org_ids)
        self._members = member_money(s, members, now) if now is not None else {}
        version = prices.version(s)
        if self._book is None or self._book[0] != version:
            self._book = prices.current(s)

    def split(
        self,
        queue: list[Request],
        specs: Mapping[str, WorkloadSpec],
        models: frozenset[str],
        hold_minutes: int,
        users: Mapping[str, str] | None = None,
    ) -> tuple[list[Request], dict[str, str]]:
        """(the requests the cycle may place, why each other one waits for balance), as `affordable` says."""
        assert self._book is not None, "read() first"
        version, book = self._book
        if self._rates_for != (version, models) or len(self._rates) > 2 * len(queue) + 1000:
            self._rates, self._rates_for = {}, (version, models)
        tenants = {r.id: r.tenant for r in queue}
        out, waits = affordable(queue, specs, self._money, book, models, hold_minutes, self._rates, users,
                                self._members)  # fmt: skip
        self.short = {tenants[wid] for wid, why in waits.items() if why.startswith(WAITING)}
        self.held = {(tenants[wid], (users or {})[wid]) for wid, why in waits.items() if why.startswith(LIMITED)}
        return out, waits
