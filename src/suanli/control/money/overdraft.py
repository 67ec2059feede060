"""When an org's charged work must stop: early enough that its balance never ends below the grace.

An org may run `balance_grace_minutes` of its hourly rate below a zero balance (usage may go below zero: the work
was admitted against a hold). The posted balance lags what has been run: metering charges whole windows
(`meter_window_s`, 60 s) on its own cadence, and a stop takes time (SIGTERM, `stop_grace_s`, SIGKILL; the pass that
notices). Waiting for the posted balance to pass the bound ended a 7 x H20 run on ¥10 at -5.46 where the bound was
-4.96. So the balance here counts every second run so far, posted or not (`cost_of` of its completed seconds, less
what each allocation was charged), and the org is out of money once that balance, less what its running work costs
during `lead_s` (the time a stop takes, and until the next pass), is below -(grace x the rate of what it runs).
The run then ends at or above the bound, less at most one second of the rate (the last second started is billed
whole), as long as the loop keeps its interval and the executor its stop grace.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.billing.ledger import org_account
from suanli.billing.metering import billable_seconds, cost_of
from suanli.billing.money import ZERO, exact
from suanli.db.models import AccountBalance, Allocation

STOP_SLACK_S = 5.0  # the least added to a stop's grace: the pass that notices the end, an executor's latency
RECENT_S = 900  # ended work whose last window is not charged yet counts if it ended this recently


def stop_lead_s(stop_grace_s: float, interval_s: float) -> float:
    """How long before the bound a stop is asked for: its SIGTERM-to-SIGKILL grace, plus two loop intervals (the
    next pass could be the one too late) but at least `STOP_SLACK_S`."""
    return stop_grace_s + max(STOP_SLACK_S, 2 * interval_s)


def broke_orgs(s: Session, now: datetime, grace_minutes: float, lead_s: float) -> dict[str, Decimal]:
    """Orgs whose charged work must stop now: org -> its balance counting every second run so far.

    Three statements, each served by an index of allocations by their stop: running charged allocations summed per
    org; those stopped in the last `RECENT_S` whose last window is not charged yet (metering settles them within a
    pass); the balances. The running allocations of an org are read one by one only when a coarse bound (its whole
    running rate since the oldest of them started) says it may be near its bound."""
    a = Allocation
    rows = s.execute(
        select(a.org_id, func.sum(a.rate_per_hour), func.sum(a.charged), func.min(a.started_at))
        .where(a.stopped_at.is_(None), a.rate_per_hour > 0)
        .group_by(a.org_id)
    ).all()
    if not rows:
        return {}
    grace, lead = Decimal(str(grace_minutes)), Decimal(str(lead_s))
    orgs = {org: (exact(Decimal(r)), exact(Decimal(c or 0)), since) for org, r, c, since in rows}
    ended: dict[str, Decimal] = defaultdict(lambda: ZERO)  # what ended work still owes, by org
    for org, rate, started, stopped, charged in s.execute(
        select(a.org_id, a.rate_per_hour, a.started_at, a.stopped_at, a.charged).where(
            a.stopped_at >= now - timedelta(seconds=RECENT_S), a.settled.is_(False), a.rate_per_hour > 0
        )
    ):
        if org in orgs:
            ended[org] += _owed(rate, started, stopped, charged, now)
    balances = _balances(s, list(orgs))
    near = []
    for org, (rate, charged, since) in orgs.items():
        ran = max(0, int((now - since).total_seconds())) + 2  # whole seconds, rounded up
        at_most = max(ZERO, rate * ran / 3600 - charged)  # not charged yet, over-counted
        if balances.get(org, ZERO) - ended[org] - at_most - rate * lead / 3600 < -(rate * grace / 60):
            near.append(org)
    running: dict[str, Decimal] = defaultdict(lambda: ZERO)
    for i in range(0, len(near), 500):
        for org, rate, started, charged in s.execute(
            select(a.org_id, a.rate_per_hour, a.started_at, a.charged).where(
                a.org_id.in_(near[i : i + 500]), a.stopped_at.is_(None), a.rate_per_hour > 0
            )
        ):
            running[org] += _owed(rate, started, None, charged, now)
    out = {}
    for org in near:
        rate = orgs[org][0]
        balance = balances.get(org, ZERO) - ended[org] - running[org]
        if balance - rate * lead / 3600 < -(rate * grace / 60):
            out[org] = exact(balance)
    return out


def _owed(rate: Decimal, started: datetime, stopped: datetime | None, charged: Decimal, now: datetime) -> Decimal:
    """What an allocation has cost by `now` beyond what it was charged: its completed seconds while it runs, every
    second it started once it stopped."""
    done = stopped is not None and stopped <= now
    end = stopped if stopped is not None and done else now
    seconds = billable_seconds(max(0.0, (end - started).total_seconds()), done)
    return max(ZERO, cost_of(exact(rate), seconds) - exact(charged))


def _balances(s: Session, orgs: list[str]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for i in range(0, len(orgs), 500):
        accounts = {org_account(o): o for o in orgs[i : i + 500]}
        for account, balance in s.execute(
            select(AccountBalance.account, AccountBalance.balance).where(AccountBalance.account.in_(list(accounts)))
        ):
            out[accounts[account]] = exact(Decimal(balance))
    return out
