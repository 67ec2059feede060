"""Billing volumes: each whole hour a volume exists, its org pays its allocated size plus the bytes only its versions
hold, at the price book's `storage_gb_month` (GB of 10^9 bytes, a month of 720 hours), one ledger transaction per
volume and hour (`volume:<id>:<hour>`: posted once however often a pass runs, or how many servers run it).

Storage is charged even when the balance is exhausted (the bytes are still kept; the balance goes below zero).
Money never deletes data: a volume of an org whose balance has been exhausted for `balance_grace_minutes` becomes
read-only (`state: read-only`: copies in refused, mounted read-only at the next launch) and becomes writable again
once the balance is above zero. Only its owners and admins remove a volume.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select

from suanli.billing.ledger import REVENUE, LedgerError, org_account, transfer
from suanli.billing.money import ZERO
from suanli.billing.prices import PriceBook
from suanli.control.money import ledger, prices
from suanli.db.engine import Database
from suanli.db.volumes import Volume
from suanli.workloads.volumes import format_size

HOUR = timedelta(hours=1)
MAX_HOURS_PER_PASS = 24 * 31  # a server that was down a month catches up over several passes
BATCH = 500


@dataclass
class VolumeMeterReport:
    charged: int = 0  # transactions posted
    amount: Decimal = ZERO
    read_only: int = 0  # volumes made read-only this pass
    writable: int = 0  # volumes writable again


def hourly_cost(v: Volume, book: PriceBook) -> Decimal:
    return book.storage_cost(v.size_bytes + v.snapshot_bytes)


def meter(db: Database, now: datetime, grace_minutes: float) -> VolumeMeterReport:
    """Charge every whole hour not charged yet, then make volumes of orgs out of money read-only (or writable
    again). One volume per transaction, a bounded batch per pass."""
    report = VolumeMeterReport()
    with db.read() as s:
        due = list(s.scalars(select(Volume.id).where(Volume.billed_until <= now - HOUR).limit(BATCH)))
        others = list(s.scalars(select(Volume.id).where((Volume.unpaid_since.is_not(None)) |
                                                        (Volume.state == "read-only")).limit(BATCH)))  # fmt: skip
    for vid in dict.fromkeys([*due, *others]):
        with db.write() as s, s.begin():
            v = s.get(Volume, vid, with_for_update=True)
            if v is None:
                continue
            _, book = prices.current(s)
            hours = 0
            while v.billed_until + HOUR <= now and hours < MAX_HOURS_PER_PASS:
                amount = hourly_cost(v, book)
                start = v.billed_until
                v.billed_until = start + HOUR
                hours += 1
                if amount <= ZERO:
                    continue
                memo = (f"volume {v.name}: {format_size(v.size_bytes)} allocated + {v.snapshot_bytes} bytes of versions, "
                        f"1 h from {start:%Y-%m-%d %H:%M}")  # fmt: skip
                try:
                    tx = transfer(f"volume:{v.id}:{int(start.timestamp())}", "usage", org_account(v.org_id), REVENUE,
                                  amount, memo)  # fmt: skip
                except LedgerError:
                    continue
                _, made = ledger.post(s, tx, now, org_id=v.org_id, user_id=v.created_by,
                                      allow_negative=[org_account(v.org_id)])  # fmt: skip
                if made:
                    report.charged += 1
                    report.amount += amount
            _money_state(s, v, now, grace_minutes, report)
    return report


def _money_state(s: object, v: Volume, now: datetime, grace_minutes: float, report: VolumeMeterReport) -> None:
    balance = ledger.org_balance(s, v.org_id)  # type: ignore[arg-type]
    if balance > ZERO:
        v.unpaid_since = None
        if v.state == "read-only":
            v.state = "ready"
            report.writable += 1
        return
    if v.unpaid_since is None:
        v.unpaid_since = now
    if v.state != "read-only" and now - v.unpaid_since >= timedelta(minutes=grace_minutes):
        v.state = "read-only"
        report.read_only += 1
