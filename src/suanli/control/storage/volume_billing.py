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
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.billing.ledger import REVENUE, LedgerError, org_account, transfer
from suanli.billing.money import ZERO, exact
from suanli.billing.prices import PriceBook
from suanli.control.money import ledger, prices
from suanli.db.engine import Database
from suanli.db.models import LedgerEntry, LedgerTransaction
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
            _charge_hours(s, v, now - HOUR, now, report)
            _money_state(s, v, now, grace_minutes, report)
    return report


def charge_begun(s: Session, v: Volume, now: datetime) -> None:
    """Charge, at the volume's size now, every hour it has begun by `now`, the one under way too: before a shrink
    or a removal, so an hour is paid at the largest size it held, not the one it ends with (a 1 TiB volume shrunk to
    1 MiB just before its hour was charged paid for 1 MiB). The caller holds the volume's row."""
    _charge_hours(s, v, now - timedelta(microseconds=1), now, VolumeMeterReport())


def _charge_hours(s: Session, v: Volume, last_start: datetime, now: datetime, report: VolumeMeterReport) -> None:
    """Charge the hours not charged yet that start at or before `last_start`, at the volume's size now."""
    _, book = prices.current(s)
    hours = 0
    while v.billed_until <= last_start and hours < MAX_HOURS_PER_PASS:
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


def usage(
    s: Session, org_id: str, since: datetime | None = None, until: datetime | None = None
) -> list[dict[str, Any]]:
    """The org's storage charges per volume (removed ones too), from the ledger: the hours charged that start in
    [since, until), what they cost (exact, what the ledger took) and the first and last of them; with the volume's
    size and hourly price now while it exists. Most expensive first."""
    acct = org_account(org_id)
    tx = LedgerTransaction
    q = (select(tx.key, tx.memo, LedgerEntry.amount).join(LedgerEntry, LedgerEntry.tx_id == tx.id)
         .where(tx.org_id == org_id, tx.kind == "usage", tx.key.like("volume:%"), LedgerEntry.account == acct))  # fmt: skip
    if since is not None:  # an hour is charged once it has ended: a charge for an hour at or after `since` is too
        q = q.where(tx.created_at >= since)
    rows: dict[str, dict[str, Any]] = {}
    for key, memo, amount in s.execute(q):
        _, vid, ts = key.split(":")
        hour = datetime.fromtimestamp(int(ts), UTC)
        if (since is not None and hour < since) or (until is not None and hour >= until):
            continue
        r = rows.get(vid)
        if r is None:
            name = memo.removeprefix("volume ").split(":", 1)[0]
            r = rows[vid] = {"volume_id": vid, "volume": name, "hours": 0, "cost": ZERO, "first_hour": hour,
                             "last_hour": hour, "size_bytes": None, "price_per_hour": None}  # fmt: skip
        r["hours"] += 1
        r["cost"] -= exact(amount)
        r["first_hour"], r["last_hour"] = min(r["first_hour"], hour), max(r["last_hour"], hour)
    if rows:
        _, book = prices.current(s)
        for v in s.scalars(select(Volume).where(Volume.id.in_(list(rows)))):
            rows[v.id].update(volume=v.name, size_bytes=v.size_bytes, price_per_hour=hourly_cost(v, book))
    return sorted(rows.values(), key=lambda r: (-r["cost"], r["volume"]))


def quote(book: PriceBook, nbytes: int, hours: int) -> dict[str, Any]:
    """What `nbytes` allocated for `hours` costs, charged as the meter does: each hour rounded to 1e-8 alone."""
    per_hour = book.storage_cost(nbytes)
    return {"bytes": nbytes, "hours": hours, "storage_gb_month": book.storage_gb_month, "per_hour": per_hour,
            "cost": per_hour * hours, "currency": book.currency}  # fmt: skip
