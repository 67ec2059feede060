"""An organisation's statement: every ledger transaction that moved its money, oldest first, each with its memo,
the workload it paid for (usage and what settling gave back), and the balance after it.

The balance after a transaction is the sum of the org's entries up to it in posting order (transaction id), which
is what the running balance holds: a page sums the entries before its first row (one range of the index by
account and transaction id) and adds its rows' amounts, in one snapshot. Pages are keyed by transaction id
(`after_id`), at most `MAX_PAGE` rows each.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from suanli.billing.ledger import org_account
from suanli.billing.money import ZERO, exact
from suanli.control.money import prices
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
    s: Session,
    org_id: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    kind: str | None = None,
    after_id: int | None = None,
    limit: int = MAX_PAGE,
) -> Page:
    """One page of the org's statement, from the first transaction at or after `since` and after `after_id`, up to
    the last one before `until`. It reads the page's own entries and, for the balance before it, one range of the
    org's entries in the index by account and transaction (a window over the whole history cost every page ~1.5 s
    at 300,000 transactions), in one statement: one snapshot. With `kind`, only that kind's rows of the page's
    `limit` transactions are returned, each still with the org's true balance after it (a page may hold fewer
    rows than `limit`: follow `next_after_id`)."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit: 1..{MAX_PAGE}")
    acct = org_account(org_id)
    e, tx = LedgerEntry, LedgerTransaction
    mine = tx.id.in_(select(e.tx_id).where(e.account == acct))
    start: int | None = after_id or 0
    if since is not None:  # from the first transaction posted at or after `since`: the pages stay contiguous
        first = s.scalar(select(func.min(tx.id)).where(tx.created_at >= since, mine))
        start = max(start or 0, first - 1) if first is not None else None
    stop = None
    if until is not None:  # to the last transaction posted before `until`, the same way
        stop = s.scalar(select(func.max(tx.id)).where(tx.created_at < until, mine))
        if stop is None:
            start = None
    found = []
    if start is not None:
        nets = (
            select(e.tx_id.label("tx_id"), func.sum(e.amount).label("net"))
            .where(e.account == acct, e.tx_id > start, *([e.tx_id <= stop] if stop is not None else []))
            .group_by(e.tx_id)
            .order_by(e.tx_id)
            .limit(limit + 1)
            .subquery()
        )
        earlier = aliased(LedgerEntry)
        opening_q = select(func.coalesce(func.sum(earlier.amount), 0)).where(earlier.account == acct,
                                                                             earlier.tx_id <= start)  # fmt: skip
        q = (
            select(tx.id, tx.created_at, tx.kind, nets.c.net, Allocation.workload, Workload.name, tx.allocation_id,
                   tx.memo, tx.key, opening_q.scalar_subquery().label("opening"))
            .join(nets, nets.c.tx_id == tx.id)
            .outerjoin(Allocation, Allocation.id == tx.allocation_id)
            .outerjoin(Workload, (Workload.id == Allocation.workload) & (Workload.org_id == org_id))
            .order_by(tx.id)
        )  # fmt: skip
        found = s.execute(q).all()
    more = len(found) > limit
    found = found[:limit]
    if found:  # the entries up to the cursor, read with the rows
        opening = exact(found[0][9] if found[0][9] is not None else ZERO)
    else:  # nothing at or after the cursor: the balance after every entry
        opening = exact(s.scalar(select(func.coalesce(func.sum(e.amount), 0)).where(e.account == acct)) or ZERO)
    rows, balance = [], opening
    for r in found:
        net = exact(r[3] if r[3] is not None else ZERO)
        balance += net
        rows.append({"id": r[0], "created_at": r[1].isoformat(), "kind": r[2], "amount": format(net, "f"),
                     "balance": format(balance, "f"), "workload": r[4] or None, "workload_name": r[5],
                     "allocation": r[6], "memo": r[7], "key": r[8]})  # fmt: skip
    _, book = prices.current(s)
    next_after = rows[-1]["id"] if more else None
    if kind is not None:
        rows = [r for r in rows if r["kind"] == kind]
    return Page(org_id, book.currency, opening, balance, rows, next_after)


FORMULA = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet run a cell as a formula
TEXT = ("kind", "workload", "workload_name", "memo", "key")  # the fields that are text, not amounts or times


def cell(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula (it starts with = + - @, a tab or a carriage return)
    starts with an apostrophe instead, so a member's email or a memo is shown, never run (CSV injection). Only
    text fields go through here: amounts keep their sign."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA) else value


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
