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
from datetime import datetime
from decimal import Decimal

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from suanli.billing.ledger import org_account
from suanli.billing.metering import billable_seconds, cost_of
from suanli.billing.money import ZERO, exact
from suanli.db.models import AccountBalance, Allocation

STOP_SLACK_S = 5.0  # the least added to a stop's grace: the pass that notices the end, an executor's latency


def stop_lead_s(stop_grace_s: float, interval_s: float) -> float:
    """How long before the bound a stop is asked for: its SIGTERM-to-SIGKILL grace, plus two loop intervals (the
    next pass could be the one too late) but at least `STOP_SLACK_S`."""
    return stop_grace_s + max(STOP_SLACK_S, 2 * interval_s)


def broke_orgs(s: Session, now: datetime, grace_minutes: float, lead_s: float) -> dict[str, Decimal]:
    """Orgs whose charged work must stop now: org -> its balance counting every second run so far.

    One aggregate statement over unsettled charged allocations and one for the balances; the allocations of an org
    are read one by one only when a coarse bound (its whole rate since its oldest one started) says it may be near."""
    a = Allocation
    running = func.sum(case((a.stopped_at.is_(None), a.rate_per_hour), else_=ZERO))
    rows = s.execute(
        select(a.org_id, running, func.sum(a.rate_per_hour), func.sum(a.charged), func.min(a.started_at))
        .where(a.settled.is_(False), a.rate_per_hour > 0)
        .group_by(a.org_id)
    ).all()
    if not rows:
        return {}
    grace = Decimal(str(grace_minutes))
    lead = Decimal(str(lead_s))
    orgs = {org: (exact(Decimal(r or 0)), exact(Decimal(t or 0)), exact(Decimal(c or 0)), since)
            for org, r, t, c, since in rows if r and Decimal(r) > 0}  # fmt: skip
    balances = _balances(s, list(orgs))
    near = []
    for org, (rate, total, charged, since) in orgs.items():
        ran = max(0, int((now - since).total_seconds())) + 2 if since is not None else 0  # whole seconds, rounded up
        at_most = max(ZERO, total * ran / 3600 - charged)  # unposted, over-counted
        if balances.get(org, ZERO) - at_most - rate * lead / 3600 < -(rate * grace / 60):
            near.append(org)
    out = {}
    for org, unposted in _unposted(s, near, now).items():
        rate = orgs[org][0]
        balance = balances.get(org, ZERO) - unposted
        if balance - rate * lead / 3600 < -(rate * grace / 60):
            out[org] = exact(balance)
    return out


def _balances(s: Session, orgs: list[str]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for i in range(0, len(orgs), 500):
        accounts = {org_account(o): o for o in orgs[i : i + 500]}
        for account, balance in s.execute(
            select(AccountBalance.account, AccountBalance.balance).where(AccountBalance.account.in_(list(accounts)))
        ):
            out[accounts[account]] = exact(Decimal(balance))
    return out


def _unposted(s: Session, orgs: list[str], now: datetime) -> dict[str, Decimal]:
    """What each org's unsettled charged allocations have cost by `now` beyond what was charged: completed seconds
    of running ones, every started second of stopped ones (their last window waits for metering)."""
    out: dict[str, Decimal] = defaultdict(lambda: ZERO)
    a = Allocation
    for i in range(0, len(orgs), 500):
        for org, rate, started, stopped, charged in s.execute(
            select(a.org_id, a.rate_per_hour, a.started_at, a.stopped_at, a.charged).where(
                a.org_id.in_(orgs[i : i + 500]), a.settled.is_(False), a.rate_per_hour > 0
            )
        ):
            end = min(stopped, now) if stopped is not None else now
            done = stopped is not None and stopped <= now
            seconds = billable_seconds(max(0.0, (end - started).total_seconds()), done)
            out[org] += max(ZERO, cost_of(exact(rate), seconds) - exact(charged))
    for org in orgs:
        out.setdefault(org, ZERO)
    return dict(out)
