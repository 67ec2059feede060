"""An organisation's statement: every ledger transaction that moved its money, oldest first, each with its memo,
the workload it paid for (usage and what settling gave back), and the balance after it.

The balance after a transaction is the sum of the org's entries up to it in posting order (transaction id), which
is what the running balance holds; one statement computes it with a window sum, so a page and its balances are
read from one snapshot. Pages are keyed by transaction id (`after_id`), at most `MAX_PAGE` rows each.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.billing.ledger import org_account
from suanli.billing.money import ZERO, exact
from suanli.control import prices
from suanli.db.models import Allocation, LedgerEntry, LedgerTransaction, Workload

MAX_PAGE = 1000
FIELDS = ("id", "created_at", "kind", "amount", "balance", "workload", "workload_name", "allocation", "memo", "key")


@dataclass(frozen=True)
class Page:
    org_id: str
    currency: str
    opening_balance: Decimal  # before the first row (the balance at `since`, or after `after_id`)
    closing_balance: Decimal  # after the last row
    rows: list[dict[str, Any]]  # FIELDS; amounts and balances exact
    next_after_id: int | None  # pass as `after_id` for the next page; None: this was the last


def page(
    s: Session, org_id: str, *, since: datetime | None = None, after_id: int | None = None, limit: int = MAX_PAGE
) -> Page:
    """One page of the org's statement, from the first transaction at or after `since` and after `after_id`."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit: 1..{MAX_PAGE}")
    acct = org_account(org_id)
    per_tx = (
        select(LedgerEntry.tx_id.label("tx_id"), func.sum(LedgerEntry.amount).label("net"))
        .where(LedgerEntry.account == acct)
        .group_by(LedgerEntry.tx_id)
        .subquery()
    )
    running = select(
        per_tx.c.tx_id, per_tx.c.net, func.sum(per_tx.c.net).over(order_by=per_tx.c.tx_id).label("balance")
    ).subquery()
    tx = LedgerTransaction
    q = (
        select(tx.id, tx.created_at, tx.kind, running.c.net, running.c.balance, Allocation.workload, Workload.name,
               tx.allocation_id, tx.memo, tx.key)
        .join(running, running.c.tx_id == tx.id)
        .outerjoin(Allocation, Allocation.id == tx.allocation_id)
        .outerjoin(Workload, (Workload.id == Allocation.workload) & (Workload.org_id == org_id))
    )  # fmt: skip
    if after_id is not None:
        q = q.where(tx.id > after_id)
    if since is not None:  # from the first transaction posted at or after `since`: the pages stay contiguous
        first = select(func.min(per_tx.c.tx_id)).join(tx, tx.id == per_tx.c.tx_id).where(tx.created_at >= since)
        q = q.where(tx.id >= first.scalar_subquery())
    found = s.execute(q.order_by(tx.id).limit(limit + 1)).all()
    more = len(found) > limit
    found = found[:limit]
    rows = [
        {"id": r[0], "created_at": r[1].isoformat(), "kind": r[2], "amount": _fixed(r[3]), "balance": _fixed(r[4]),
         "workload": r[5] or None, "workload_name": r[6], "allocation": r[7], "memo": r[8], "key": r[9]}
        for r in found
    ]  # fmt: skip
    if found:
        opening, closing = exact(found[0][4] - found[0][3]), exact(found[-1][4])
    else:  # nothing at or after the cursor: the balance after every entry
        total = select(func.coalesce(func.sum(LedgerEntry.amount), 0)).where(LedgerEntry.account == acct)
        opening = closing = exact(s.scalar(total) or ZERO)
    _, book = prices.current(s)
    return Page(org_id, book.currency, opening, closing, rows, rows[-1]["id"] if more else None)


FORMULA = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet run a cell as a formula
TEXT = ("kind", "workload", "workload_name", "memo", "key")  # the fields that are text, not amounts or times


def cell(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula (it starts with = + - @, a tab or a carriage return)
    starts with an apostrophe instead, so a member's email or a memo is shown, never run (CSV injection). Only
    text fields go through here: amounts keep their sign."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA) else value


def _fixed(value: Any) -> str:
    return format(exact(value if value is not None else ZERO), "f")


def to_csv(rows: list[dict[str, Any]], header: bool = True) -> str:
    """The rows as CSV: exact decimals (8 places), ISO times, empty cells for what a row lacks, text that starts
    like a formula behind an apostrophe (`cell`)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    if header:
        w.writeheader()
    for r in rows:
        w.writerow({k: "" if r[k] is None else cell(r[k]) if k in TEXT else r[k] for k in FIELDS})
    return buf.getvalue()
