"""A member's monthly spend limit: what they charged the org this calendar month (UTC), the rate of their running
work, and the refusal (403 naming `monthly_spend_limit`) of what would take them past it: at submission, at
placement (`Spending`, counted as a scheduling pass places more), at a resize and at a plan purchase."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.billing.ledger import org_account
from suanli.billing.money import exact
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Forbidden, Invalid
from suanli.db.models import Allocation, LedgerEntry, LedgerTransaction, Membership

if TYPE_CHECKING:
    from suanli.control.accounts.memberships import Access

CHARGE_KINDS = ("usage", "plan_purchase", "refund")  # what counts against a spend limit (fault credits back)


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def month_to_date(s: Session, org_id: str, now: datetime, user_id: str | None = None) -> dict[str, Decimal]:
    """Each member's charges to the org this calendar month (UTC): usage and plan purchases attributed to them,
    less fault credits for their work. `user_id`: that member only."""
    q = (
        select(LedgerTransaction.user_id, func.sum(LedgerEntry.amount))
        .join(LedgerEntry, LedgerEntry.tx_id == LedgerTransaction.id)
        .where(LedgerTransaction.org_id == org_id, LedgerTransaction.created_at >= month_start(now),
               LedgerTransaction.kind.in_(CHARGE_KINDS), LedgerEntry.account == org_account(org_id))
        .group_by(LedgerTransaction.user_id)
    )  # fmt: skip
    if user_id is not None:
        q = q.where(LedgerTransaction.user_id == user_id)
    return {uid: exact(-Decimal(net or 0)) for uid, net in s.execute(q) if uid is not None}


def running_rate(s: Session, org_id: str, user_id: str) -> Decimal:
    """The hourly rate of the member's work running in the org now."""
    running = s.scalar(
        select(func.sum(Allocation.rate_per_hour)).where(
            Allocation.org_id == org_id, Allocation.user_id == user_id, Allocation.stopped_at.is_(None)
        )
    )
    return exact(Decimal(running or 0))


def spend_refusal(
    org_id: str, limit: Decimal, spent: Decimal, running: Decimal, *, rate: Decimal = Decimal(0),
    hold_minutes: int = 0, price: Decimal = Decimal(0),
) -> str | None:  # fmt: skip
    """Why this would take the member past their limit (naming `monthly_spend_limit`), or None: this month's
    charges `spent`, plus `hold_minutes` of their `running` work and the new work's `rate` (the hold admission asks
    of the balance), plus a `price` paid now (a plan)."""
    held = exact((running + rate) * hold_minutes / 60)
    if spent + held + price <= limit:
        return None
    parts = [f"{spent:.2f} is charged this month"]
    if held:
        parts.append(f"{hold_minutes} minutes of your running work and this ({rate:.2f}/h) hold {held:.2f}")
    if price:
        parts.append(f"this costs {price:.2f}")
    return (f"monthly_spend_limit: you may spend {limit:.2f} of organisation {org_id}'s money a month; "
            f"{', and '.join(parts)}; ask an owner or admin to raise your limit")  # fmt: skip


def check_spend(
    s: Session, who: Principal, a: Access, now: datetime, *, rate: Decimal = Decimal(0), hold_minutes: int = 0,
    price: Decimal = Decimal(0),
) -> None:  # fmt: skip
    """Refuse (403 naming `monthly_spend_limit`) what would take the member past their limit (`spend_refusal`)."""
    if a.spend_limit is None:
        return
    spent = month_to_date(s, a.org.id, now, who.user_id).get(who.user_id, Decimal(0))
    why = spend_refusal(a.org.id, a.spend_limit, spent, running_rate(s, a.org.id, who.user_id), rate=rate,
                        hold_minutes=hold_minutes, price=price)  # fmt: skip
    if why is not None:
        raise Forbidden(why)


@dataclass
class Spending:
    """A member's limit, this month's charges and the rate of their running work in one org, read at placement
    (under the org's row lock) and added to as a scheduling pass places more of their work."""

    org_id: str
    limit: Decimal
    spent: Decimal
    running: Decimal

    def admit(self, rate: Decimal, hold_minutes: int) -> str | None:
        """Count work at `rate` as running, or say why the limit refuses it."""
        why = spend_refusal(self.org_id, self.limit, self.spent, self.running, rate=rate, hold_minutes=hold_minutes)
        if why is None:
            self.running += rate
        return why


def spending(s: Session, org_id: str, user_id: str, now: datetime) -> Spending | None:
    """The member's `Spending` in the org; None where they have no limit (or are not a member: an operator)."""
    limit = s.scalar(select(Membership.monthly_spend_limit).where(Membership.org_id == org_id,
                                                                  Membership.user_id == user_id))  # fmt: skip
    if limit is None:
        return None
    spent = month_to_date(s, org_id, now, user_id).get(user_id, Decimal(0))
    return Spending(org_id, exact(Decimal(limit)), spent, running_rate(s, org_id, user_id))


def check_limit(limit: Decimal | None) -> Decimal | None:
    if limit is not None and not Decimal(0) <= limit <= Decimal(1_000_000_000):
        raise Invalid("monthly_spend_limit: 0 to 1000000000 (or null: no limit)")
    return None if limit is None else exact(limit)
