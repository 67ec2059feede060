"""Allocations and their per-second charges: admission holds, quotas, the metering loop (the usage statement that
lists them is `usage_statement`).

The metering loop is a state machine over allocation rows with a lease: a worker claims open rows whose
lease is free or expired, and for each one, in ONE database transaction, posts the charges due (pure
`billing.metering.charges_due`), advances `metered_until_s` and releases the lease. A crash anywhere
leaves either all of that or none of it; a crashed worker's rows are taken over when its lease expires;
and the charge keys make even a stale retry post nothing twice. Allocations billed by usage are charged the same
way, from their GPUs' readings (`control/money/usage.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.billing.metering import DEFAULT_WINDOW_S, billable_seconds, charges_due, cost_of
from suanli.billing.money import ZERO, exact, shown
from suanli.billing.prices import PriceBook
from suanli.control.errors import Conflict, Invalid, NotFound, PaymentRequired
from suanli.control.ids import new_id
from suanli.control.money import late_ends, ledger, prices, usage
from suanli.control.scheduling import inventory
from suanli.db.models import Allocation, Org
from suanli.workloads.host import cores, gib


# ---- admission ----------------------------------------------------------------------------------------------
def open_rates(s: Session, org_id: str) -> Decimal:
    total = s.scalar(
        select(func.sum(Allocation.rate_per_hour)).where(Allocation.org_id == org_id, Allocation.stopped_at.is_(None))
    )
    return exact(total or ZERO)


@dataclass
class OrgLoad:
    """What an org holds and has, read once under its row lock; a scheduling pass admits many placements of one
    org against it, adding each as it goes, instead of summing its open allocations again for every one."""

    org: Org
    rate: Decimal  # per hour, of everything it holds
    gpus: int
    balance: Decimal
    cpu_milli: int = 0  # host CPU and memory it holds
    memory_mib: int = 0


def org_load(s: Session, org_id: str) -> OrgLoad:
    # Admissions to one org queue on its row (FOR NO KEY UPDATE: ledger inserts' foreign-key checks do not wait),
    # so two racing admissions cannot both count on the same balance or quota (SQLite: the write lock at BEGIN).
    org = s.get(Org, org_id, with_for_update={"key_share": True}, populate_existing=True)
    if org is None:
        raise NotFound(f"organisation {org_id} not found")
    a = Allocation
    rate, gpus, cpu, mem = s.execute(
        select(func.coalesce(func.sum(a.rate_per_hour), 0), func.coalesce(func.sum(a.gpus), 0),
               func.coalesce(func.sum(a.cpu_milli), 0), func.coalesce(func.sum(a.memory_mib), 0))
        .where(a.org_id == org_id, a.stopped_at.is_(None))
    ).one()  # fmt: skip
    return OrgLoad(org, exact(Decimal(rate)), int(gpus), ledger.org_balance(s, org_id), int(cpu), int(mem))


def quota_refusal(org: Org, gpus: int, cpu_milli: int, memory_mib: int, held: tuple[int, int, int]) -> str | None:
    """Why holding this on top of `held` (GPUs, milli-cores, MiB) would break one of the org's quotas, or None."""
    have_gpus, have_cpu, have_mem = held
    if org.quota_gpus is not None and have_gpus + gpus > org.quota_gpus:
        return f"{org.name} may hold {org.quota_gpus} GPUs at once; it holds {have_gpus}, asks {gpus}"
    if org.quota_cpus is not None and cpu_milli and have_cpu + cpu_milli > org.quota_cpus * 1000:
        return (f"{org.name} may hold {org.quota_cpus} CPU cores at once; it holds {cores(have_cpu)}, "
                f"asks {cores(cpu_milli)}")  # fmt: skip
    if org.quota_memory_gib is not None and memory_mib and have_mem + memory_mib > org.quota_memory_gib * 1024:
        return (f"{org.name} may hold {org.quota_memory_gib} GiB of memory at once; it holds {gib(have_mem)} GiB, "
                f"asks {gib(memory_mib)} GiB")  # fmt: skip
    return None


def admit(
    load: OrgLoad, rate_per_hour: Decimal, gpus: int, hold_minutes: int, cpu_milli: int = 0, memory_mib: int = 0
) -> None:
    """The org's balance must cover `hold_minutes` of everything it runs, this too; and its GPU, CPU and memory
    quotas. Work at a zero rate (a plan's prepaid GPUs, no host CPU or memory) costs the org nothing more: no balance,
    however far below zero, refuses it."""
    org = load.org
    why = quota_refusal(org, gpus, cpu_milli, memory_mib, (load.gpus, load.cpu_milli, load.memory_mib))
    if why is not None:
        raise Conflict(f"quota: {why}")
    need = exact((load.rate + rate_per_hour) * hold_minutes / 60)
    if rate_per_hour > 0 and load.balance < need:
        raise PaymentRequired(
            f"balance {shown(load.balance)} does not cover {hold_minutes} minutes of running work at "
            f"{shown(load.rate + rate_per_hour)}/h ({shown(need)} needed); top up first"
        )
    load.rate += rate_per_hour
    load.gpus += gpus
    load.cpu_milli += cpu_milli
    load.memory_mib += memory_mib


def admitted_row(
    s: Session,
    *,
    org_id: str,
    user_id: str,
    workload: str,
    gpu_model: str | None,
    gpus: int,
    placement: dict[str, list[int]],
    now: datetime,
    hold_minutes: int,
    milli: int = 1000,
    mode: str = "on-demand",  # on-demand | spot | usage | plan:<id> (prepaid: pass rate 0)
    allocation_id: str | None = None,
    rate: Decimal | None = None,
    load: OrgLoad | None = None,
    book: PriceBook | None = None,
    cpu_milli: int = 0,
    memory_mib: int = 0,
    check: bool = True,
) -> dict[str, Any]:
    """The allocation row to insert, once admission passed. Its rate is its GPUs' (the price book's in force now,
    or `rate`: zero for GPUs of a prepaid plan) plus its host CPU and memory at the book's prices (on-demand for a
    plan, whose prepaid GPUs do not include them). Nothing is written: a refusal leaves nothing to undo.

    `check=False` skips admission (balance, quotas) but still counts the row in `load`: for running work shrunk to
    fewer GPUs, which never needs more than it was admitted for."""
    if gpus < 0 or not 0 < milli <= 1000 or cpu_milli < 0 or memory_mib < 0:
        raise Invalid("gpus, cpu_milli, memory_mib: >= 0; milli: 1..1000")
    if rate is None and mode.startswith("plan"):
        raise Invalid("billing: a plan's GPUs are prepaid; pass their rate")
    if book is None and ((rate is None and gpu_model is not None and gpus > 0) or cpu_milli or memory_mib):
        _, book = prices.current(s)
    floor = None
    if rate is None:
        rate = ZERO
        if gpu_model is not None and gpus > 0:
            assert book is not None
            try:
                rate = book.rate(gpu_model, gpus, mode, milli)  # type: ignore[arg-type]
                floor = book.usage_floor_rate(gpu_model, gpus) if mode == "usage" else None
            except (KeyError, ValueError) as e:
                raise Invalid(f"gpu: {e.args[0]}") from e
    if mode == "usage" and floor is None:
        raise Invalid("billing: usage is billed by the measured activity of whole GPUs at the price book's usage price")
    host = ZERO
    if cpu_milli or memory_mib:
        assert book is not None
        host = book.host_rate(cpu_milli, memory_mib, "spot" if mode == "spot" else "on-demand")
    total = exact(rate + host)
    load = load if load is not None else org_load(s, org_id)
    if check:
        admit(load, total, gpus, hold_minutes, cpu_milli, memory_mib)
    else:
        load.rate, load.gpus = load.rate + total, load.gpus + gpus
        load.cpu_milli, load.memory_mib = load.cpu_milli + cpu_milli, load.memory_mib + memory_mib
    return dict(
        id=allocation_id or new_id("alloc"), org_id=org_id, user_id=user_id, workload=workload, gpu_model=gpu_model,
        gpus=gpus, milli=milli, billing_mode=mode, rate_per_hour=total, cpu_milli=cpu_milli, memory_mib=memory_mib,
        host_rate_per_hour=host, floor_rate_per_hour=floor, activity_permille_s=0, placement=placement,
        started_at=now, stopped_at=None, metered_until_s=0, settled=False, charged=ZERO, lock_owner=None,
        lock_expires_at=None,
    )  # fmt: skip


def open_allocation(s: Session, **kw: Any) -> Allocation:
    """Admit and record GPUs held by a workload from `now` (see `admitted_row` for the arguments)."""
    row = Allocation(**admitted_row(s, **kw))
    s.add(row)
    s.flush()
    inventory.bump_version(s)
    return row


def close_allocation(s: Session, allocation_id: str, now: datetime) -> Allocation:
    """Record the stop at `now`: the moment it ended, however late that is learned (an executor's exit record read
    by a server that restarted after the end). A metering pass may already have charged windows past it (while the
    end was unknown, or its clock read later): settling gives those seconds back (`settle_credit`), so the net bill
    is exactly `cost_of(rate, billed seconds)` of the run to its true end."""
    row = s.get(Allocation, allocation_id, with_for_update=True, populate_existing=True)
    if row is None:
        raise NotFound(f"allocation {allocation_id} not found")
    if row.stopped_at is None:
        row.stopped_at = max(now, row.started_at)
        inventory.bump_version(s)
    return row


def stop_earlier(s: Session, allocation_id: str, end: datetime, now: datetime) -> None:
    """Move a recorded stop back to when the run really ended (learned later). An allocation not yet settled is
    settled from there by the next pass; one already settled is given back at once what it paid beyond that."""
    a = s.get(Allocation, allocation_id, with_for_update=True, populate_existing=True)
    if a is None or a.stopped_at is None or a.stopped_at <= end:
        return
    a.stopped_at = max(end, a.started_at)
    if a.settled:
        billed = billable_seconds((a.stopped_at - a.started_at).total_seconds(), True)
        if a.billing_mode == usage.USAGE:  # charged by activity, not at its full rate
            usage.credit_past_end(s, a, billed, now)
        else:
            settle_credit(s, a, billed, now, MeterReport())
        a.metered_until_s = billed


# ---- the metering loop ----------------------------------------------------------------------------------------
@dataclass
class MeterReport:
    claimed: list[str] = field(default_factory=list)
    posted: int = 0  # charges this worker created
    repeated: int = 0  # charges it found already posted (work done twice: zero while leases work)
    amount: Decimal = ZERO
    settled: int = 0
    credited: Decimal = ZERO  # given back for seconds charged past a run's end


def claim(s: Session, owner: str, now: datetime, lease_s: float, limit: int) -> list[str]:
    """Lease up to `limit` unsettled allocations to `owner`; another worker skips them until the lease ends."""
    q = (
        select(Allocation.id)
        .where(Allocation.settled.is_(False))
        .where(or_(Allocation.lock_owner.is_(None), Allocation.lock_expires_at < now))
        .order_by(Allocation.lock_expires_at.is_not(None), Allocation.started_at)
        .limit(limit)
    )
    if s.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(skip_locked=True)
    ids = list(s.scalars(q))
    if ids:
        s.execute(
            update(Allocation)
            .where(Allocation.id.in_(ids))
            .values(lock_owner=owner, lock_expires_at=now + timedelta(seconds=lease_s))
        )
    return ids


def meter_allocation(
    s: Session,
    allocation_id: str,
    owner: str,
    now: datetime,
    window_s: int,
    report: MeterReport,
    usage_policy: usage.UsagePolicy = usage.UsagePolicy(),
) -> None:
    """Post what is due for one leased allocation and release it, all in the caller's transaction."""
    # The row lock keeps a close (or a worker that took the lease over) from changing the row under us; another
    # worker's claim skips it meanwhile (SKIP LOCKED). SQLite's write lock taken at BEGIN does the same.
    a = s.get(Allocation, allocation_id, with_for_update=True, populate_existing=True)
    if a is None or a.lock_owner != owner:
        return  # the lease was lost (expired and taken over): leave the work to the new owner
    if a.billing_mode == usage.USAGE:  # charged from its GPUs' readings once they are in (control/money/usage.py)
        done = usage.meter_allocation(s, a, now, window_s, usage_policy)
        report.posted, report.repeated = report.posted + done.posted, report.repeated + done.repeated
        report.amount += done.amount
        report.credited += done.credited
        report.settled += done.settled
        a.lock_owner, a.lock_expires_at = None, None
        return
    stopped = a.stopped_at is not None
    end = a.stopped_at if stopped else now
    elapsed = max(0.0, (end - a.started_at).total_seconds())
    paid_s = a.metered_until_s
    done = {k for k in range(paid_s // window_s)}
    for c in charges_due(a.id, a.rate_per_hour, elapsed, stopped, done, window_s):
        # The window size changed since the last pass (the operator's setting): seconds before `paid_s` are paid
        # already, so the first window is charged from there; its key (window size in it) was never used.
        start_s = max(c.start_s, paid_s)
        if c.end_s <= start_s:  # paid past the end already: settling gives the difference back
            continue
        amount = cost_of(a.rate_per_hour, c.end_s) - cost_of(a.rate_per_hour, start_s)
        if amount == ZERO:
            continue
        tx = transfer(c.key, "usage", org_account(a.org_id), REVENUE, amount,
                      f"{a.workload or a.id}: {start_s}-{c.end_s} s")  # fmt: skip
        _, created = ledger.post(
            s, tx, now, org_id=a.org_id, user_id=a.user_id, allocation_id=a.id, allow_negative=[org_account(a.org_id)]
        )
        if created:
            report.posted += 1
            report.amount += amount
            a.charged = exact(a.charged + amount)
        else:
            report.repeated += 1
        a.metered_until_s = c.end_s
    billed = billable_seconds(elapsed, stopped)
    if stopped:
        settle_credit(s, a, billed, now, report)
    # A pass whose clock reads earlier than the last one's (another process, or a claim that waited) must not move
    # `metered_until_s` back: the next pass would recompute windows already charged.
    a.metered_until_s = billed if stopped else max(a.metered_until_s, billed - billed % window_s)
    if stopped:
        a.settled = True
        report.settled += 1
    a.lock_owner, a.lock_expires_at = None, None


def settle_credit(s: Session, a: Allocation, billed: int, now: datetime, report: MeterReport) -> Decimal:
    """Give back what was charged beyond `cost_of(rate, billed)`: windows posted past the end of a run while its end
    was not yet known (its server was down, the loop waited for a dead leader's lease, or a pass's clock read later
    than the stop). One `refund` per correction (key `usage-credit:<allocation>:<seconds billed>`, its memo naming
    the seconds): an end corrected twice (settled, then an earlier end learned from the executor) is given back
    twice, each what it owes; one key per allocation refused the second (409), failing its pass every time."""
    over = exact(a.charged - cost_of(a.rate_per_hour, billed))
    if over <= ZERO:
        return ZERO
    given = late_ends.give_back(s, a, billed, a.metered_until_s, over, now)
    report.credited += given
    return given


def meter(
    db: Any,
    owner: str,
    now: datetime,
    *,
    window_s: int = DEFAULT_WINDOW_S,
    lease_s: float = 60.0,
    batch: int = 200,
    usage_policy: usage.UsagePolicy = usage.UsagePolicy(),
) -> MeterReport:
    """One pass of the metering loop; `db` is a `suanli.db.engine.Database`. `usage_policy`: how allocations billed
    by usage read their GPUs' readings (control/money/usage.py)."""
    report = MeterReport()
    with db.write() as s, s.begin():
        ids = claim(s, owner, now, lease_s, batch)
    report.claimed = ids
    for allocation_id in ids:
        with db.write() as s, s.begin():
            meter_allocation(s, allocation_id, owner, now, window_s, report, usage_policy)
    return report
