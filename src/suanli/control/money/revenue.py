"""What the platform earned: the net of the `revenue` account's entries, by UTC day and by what was sold (a GPU
model for GPU work, `CPU` for CPU-only work, else the transaction's kind: a plan, storage, a refund)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.billing.ledger import REVENUE
from suanli.db.models import Allocation, LedgerEntry, LedgerTransaction

MAX_DAYS = 366


def by_day(s: Session, days: int, now: datetime) -> dict[str, dict[str, Decimal]]:
    """{day (YYYY-MM-DD, UTC): {what: net amount}} for the last `days` UTC days, today included, every day present.
    Exact: the entries' Decimal amounts are summed as they are, nothing rounded."""
    first = (now - timedelta(days=days - 1)).date()
    since = datetime(first.year, first.month, first.day, tzinfo=now.tzinfo)
    e, t, a = LedgerEntry, LedgerTransaction, Allocation
    q = (
        select(t.created_at, t.kind, t.allocation_id, a.gpu_model, e.amount)
        .join(t, t.id == e.tx_id)
        .outerjoin(a, a.id == t.allocation_id)
        .where(e.account == REVENUE, t.created_at >= since)
    )
    out: dict[str, dict[str, Decimal]] = {(first + timedelta(days=i)).isoformat(): {} for i in range(days)}
    for at, kind, alloc, model, amount in s.execute(q):
        day = out.get(at.date().isoformat())
        if day is None:  # dated after now (a clock step): not in this window
            continue
        what = (model or "CPU") if alloc else kind
        day[what] = day.get(what, Decimal(0)) + amount
    return out
