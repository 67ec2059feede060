"""Charging for tokens: a key of another org on an endpoint with a price pays the endpoint's org per 1M tokens, one
balanced ledger transaction per usage row part (payer's account debited, owner's credited, the same exact amount),
idempotent by row and token range, never more than the payer has (the owner's replica reports the usage), and
counted against the key maker's monthly spend limit and never past it. Keys of the endpoint's own org pay nothing
per token: their org already pays the replicas' GPU time.

Run by the serving pass's leader; rows are charged once their minute is `SETTLE_S` old (the gateways report every
second, so a minute is then complete; a later report is charged on a later pass)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from suanli.billing.ledger import org_account, transfer
from suanli.billing.tokens import part_charge
from suanli.control.accounts import spend_limits
from suanli.control.errors import PaymentRequired
from suanli.control.money import ledger
from suanli.db.engine import Database, DatabaseUnavailable, transient
from suanli.db.models import Membership
from suanli.db.serving import Endpoint, EndpointKey, EndpointUsage

SETTLE_S = 60.0
ZERO = Decimal(0)
BATCH = 500

log = logging.getLogger(__name__)


def price_of(spec: dict) -> Decimal | None:
    p = spec.get("price_per_1m_tokens")
    return Decimal(p) if p not in (None, "") else None


def charge(db: Database, now: datetime) -> int:
    """Charge what is due; the number of ledger transactions posted. Each row on its own: one that can never be
    charged is logged and settled uncharged, never left to stop the rows after it on every pass; one the database
    or a concurrent debit of the payer got in the way of is charged next pass."""
    cutoff = now - timedelta(seconds=SETTLE_S)
    u = EndpointUsage
    with db.read() as s:
        due = list(s.execute(
            select(u.endpoint_id, u.key_id, u.minute)
            .where(u.minute <= cutoff, u.charged_tokens < u.prompt_tokens + u.completion_tokens)
            .order_by(u.minute, u.endpoint_id, u.key_id).limit(BATCH)
        ))  # fmt: skip
    posted = 0
    for eid, kid, minute in due:
        try:
            posted += _charge_row(db, eid, kid, minute, now)
        except (OperationalError, DatabaseUnavailable, PaymentRequired) as e:
            if isinstance(e, PaymentRequired) or transient(e):  # the database or a concurrent debit: next pass
                log.warning("tokens of endpoint %s, key %s, minute %s: charged next pass (%s)", eid, kid, minute, e)
                continue
            _forgive(db, eid, kid, minute)
        except Exception:
            _forgive(db, eid, kid, minute)
    return posted


def _forgive(db: Database, eid: str, kid: str, minute: datetime) -> None:
    """A row that cannot ever be charged (an amount that does not fit, a fault) is settled unpaid, logged."""
    u = EndpointUsage
    log.exception("tokens of endpoint %s, key %s, minute %s: not charged; settled without", eid, kid, minute)
    with db.write() as s, s.begin():
        s.execute(update(EndpointUsage).where(u.endpoint_id == eid, u.key_id == kid, u.minute == minute)
                  .values(charged_tokens=u.prompt_tokens + u.completion_tokens))  # fmt: skip


def _charge_row(db: Database, eid: str, kid: str, minute: datetime, now: datetime) -> int:
    u = EndpointUsage
    posted = 0
    with db.write() as s, s.begin():
        row = s.get(EndpointUsage, (eid, kid, minute), with_for_update=True, populate_existing=True)
        if row is None or row.charged_tokens >= row.prompt_tokens + row.completion_tokens:
            return 0
        total = row.prompt_tokens + row.completion_tokens
        e, k = s.get(Endpoint, eid), s.get(EndpointKey, kid)
        price = price_of(e.spec) if e is not None else None
        if e is not None and k is not None and price and k.org_id != e.org_id:
            # Money moves, it is never made: the payer gives at most what it has (the replica runs the seller's
            # code, which reports the usage; the gateway refuses the key once nothing is left).
            amount = min(part_charge(row.charged_tokens, total, price), max(ledger.org_balance(s, k.org_id), ZERO))
            # Nor more than the key's maker may still spend there this month: the gateway lets a request in while
            # any is left, and a member's key on the member's own priced endpoint would otherwise move the whole
            # balance to the member's org past a limit of ¥1 (what is over is forgiven: the owner was its maker).
            limit = s.scalar(select(Membership.monthly_spend_limit).where(Membership.org_id == k.org_id,
                                                                         Membership.user_id == k.user_id))  # fmt: skip
            if limit is not None:
                spent = spend_limits.month_to_date(s, k.org_id, now, k.user_id).get(k.user_id, ZERO)
                amount = min(amount, max(limit - spent, ZERO))
            if amount > 0:
                key = f"serve:{eid}:{kid}:{minute:%Y%m%d%H%M}:{row.charged_tokens}-{total}"
                memo = (f"{total - row.charged_tokens} tokens of endpoint {e.name} ({e.id}) at {price}/1M, "
                        f"key {k.id}, minute {minute:%Y-%m-%d %H:%M} UTC")  # fmt: skip
                tx = transfer(key, "usage", org_account(k.org_id), org_account(e.org_id), amount, memo)
                ledger.post(s, tx, now, org_id=k.org_id, user_id=k.user_id)  # the maker's spend, as their work
                posted = 1
        s.execute(update(EndpointUsage).where(u.endpoint_id == eid, u.key_id == kid, u.minute == minute)
                  .values(charged_tokens=total))  # fmt: skip
    return posted
