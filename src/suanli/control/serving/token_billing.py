"""Charging for tokens: a key of another org on an endpoint with a price pays the endpoint's org per 1M tokens, one
balanced ledger transaction per usage row part (payer's account debited, owner's credited, the same exact amount),
idempotent by row and token range. Keys of the endpoint's own org pay nothing per token: their org already pays
the replicas' GPU time.

Run by the serving pass's leader; rows are charged once their minute is `SETTLE_S` old (the gateways report every
second, so a minute is then complete; a later report is charged on a later pass)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select, update

from suanli.billing.ledger import org_account, transfer
from suanli.billing.tokens import part_charge
from suanli.control.money import ledger
from suanli.db.engine import Database
from suanli.db.serving import Endpoint, EndpointKey, EndpointUsage

SETTLE_S = 60.0
BATCH = 500


def price_of(spec: dict) -> Decimal | None:
    p = spec.get("price_per_1m_tokens")
    return Decimal(p) if p not in (None, "") else None


def charge(db: Database, now: datetime) -> int:
    """Charge what is due; the number of ledger transactions posted."""
    cutoff = now - timedelta(seconds=SETTLE_S)
    u = EndpointUsage
    with db.read() as s:
        due = list(s.execute(
            select(u.endpoint_id, u.key_id, u.minute)
            .where(u.minute <= cutoff, u.charged_tokens < u.prompt_tokens + u.completion_tokens).limit(BATCH)
        ))  # fmt: skip
    posted = 0
    for eid, kid, minute in due:
        with db.write() as s, s.begin():
            row = s.get(EndpointUsage, (eid, kid, minute), with_for_update=True, populate_existing=True)
            if row is None or row.charged_tokens >= row.prompt_tokens + row.completion_tokens:
                continue
            total = row.prompt_tokens + row.completion_tokens
            e, k = s.get(Endpoint, eid), s.get(EndpointKey, kid)
            price = price_of(e.spec) if e is not None else None
            if e is not None and k is not None and price and k.org_id != e.org_id:
                amount = part_charge(row.charged_tokens, total, price)
                if amount > 0:
                    key = f"serve:{eid}:{kid}:{minute:%Y%m%d%H%M}:{row.charged_tokens}-{total}"
                    memo = (f"{total - row.charged_tokens} tokens of endpoint {e.name} ({e.id}) at {price}/1M, "
                            f"key {k.id}, minute {minute:%Y-%m-%d %H:%M} UTC")  # fmt: skip
                    tx = transfer(key, "usage", org_account(k.org_id), org_account(e.org_id), amount, memo)
                    # The tokens were served: the payer goes below zero if it must (the gateway refuses its keys then).
                    ledger.post(s, tx, now, org_id=k.org_id, allow_negative=[org_account(k.org_id)])
                    posted += 1
            s.execute(update(EndpointUsage).where(u.endpoint_id == eid, u.key_id == kid, u.minute == minute)
                      .values(charged_tokens=total))  # fmt: skip
    return posted
