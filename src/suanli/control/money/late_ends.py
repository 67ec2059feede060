"""The refund for windows charged past a run's end, its end learned only after they were charged: one shape for
per-second metering (`metering.settle_credit`) and usage metering (`usage.credit_past_end`)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy.orm import Session

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.billing.money import ZERO, exact
from suanli.control.money import ledger
from suanli.db.models import Allocation


def give_back(s: Session, a: Allocation, billed: int, paid: int, over: Decimal, now: datetime) -> Decimal:
    """Post `over` back to the allocation's org as one `refund` keyed `usage-credit:<allocation>:<seconds billed>`
    (an end corrected twice is given back twice, each what it owes) and take it off what the allocation was
    charged; what was given back (zero when this very correction was posted before)."""
    memo = (f"{a.workload or a.id}: ran {billed} s, {paid} s were charged before its end was known: "
            f"{paid - billed} s given back")  # fmt: skip
    tx = transfer(f"usage-credit:{a.id}:{billed}", "refund", REVENUE, org_account(a.org_id), over, memo[:500])
    _, created = ledger.post(s, tx, now, org_id=a.org_id, user_id=a.user_id, allocation_id=a.id)
    if not created:
        return ZERO
    a.charged = exact(a.charged - over)
    return over
