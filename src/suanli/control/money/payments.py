"""Top-ups paid through a payment provider: the provider's signed webhook, verified by its adapter
(`suanli.payments`), posts a `topup` ledger transaction from `external` to the org the event names.

Each event posts once: its ledger key is `payment:<provider>:<event id>`, unique, so the provider's retries and
a replay within the signature's tolerance find the transaction already there (`duplicate`), and the same event id
with another org or amount is 409. The amount must be whole cents, more than 0 and at most `payment_max_amount`,
in the price book's currency; the org must be named by its id. The rules are in docs/payments.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy.orm import Session

from suanli.billing.money import ZERO
from suanli.control.accounts.accounts import ID_SHAPE
from suanli.control.errors import Invalid, NotFound, Unauthorized
from suanli.control.money import ledger, prices
from suanli.control.settings import Settings
from suanli.db.engine import Database
from suanli.db.models import Org
from suanli.payments.base import EventError, PaymentProvider, SignatureError, TopUpEvent
from suanli.payments.hmac_provider import HmacProvider

CENT = Decimal("0.01")


def providers(settings: Settings) -> dict[str, PaymentProvider]:
    """The providers the operator configured, by name. A real provider's adapter is added here, built from its
    own settings (its secret never leaves the server's settings)."""
    found: dict[str, PaymentProvider] = {}
    if settings.payment_hmac_secret:
        found[HmacProvider.name] = HmacProvider(settings.payment_hmac_secret, settings.payment_tolerance_s)
    return found


@dataclass(frozen=True)
class Payment:
    provider: str
    event_id: str
    org_id: str
    amount: str  # exact, as posted
    transaction_id: int
    duplicate: bool  # the event was posted before: nothing was credited now


def verify(provider: PaymentProvider, headers: Mapping[str, str], body: bytes, now: datetime) -> TopUpEvent:
    """The adapter's verdict as service errors: a bad or stale signature 401, a signed but unusable event 422."""
    try:
        return provider.verify(headers, body, now)
    except SignatureError as e:
        raise Unauthorized(f"webhook: {e}") from None
    except EventError as e:
        raise Invalid(str(e)) from None


def post(s: Session, event: TopUpEvent, now: datetime, max_amount: Decimal) -> Payment:
    """Post the event's top-up once (by its provider and id); a repeat returns the first posting as `duplicate`."""
    if not ZERO < event.amount <= max_amount or event.amount != event.amount.quantize(CENT):
        raise Invalid(f"amount: more than 0, at most {max_amount}, in whole cents")
    if not ID_SHAPE.fullmatch(event.org_id) or not event.org_id.startswith("org_"):
        raise Invalid("org: must be an organisation id (org_…), not a name")
    if s.get(Org, event.org_id) is None:
        raise NotFound(f"org: organisation {event.org_id} not found")
    currency = prices.current(s)[1].currency
    if event.currency != currency:
        raise Invalid(f"currency: {event.currency}; this server's balances are in {currency}")
    key = f"payment:{event.provider}:{event.event_id}"
    memo = f"payment {event.provider} {event.event_id}"
    tx, created = ledger.move(s, "topup", event.org_id, event.amount, key, now, memo)
    return Payment(event.provider, event.event_id, event.org_id, format(event.amount, "f"), tx.id, not created)


def receive(db: Database, settings: Settings, name: str, headers: Mapping[str, str], body: bytes,
            now: datetime) -> Payment:  # fmt: skip
    """What the webhook route calls: find the provider (404 if the operator configured none of that name), verify
    the request, post the top-up."""
    provider = providers(settings).get(name)
    if provider is None:
        raise NotFound(f"provider: no payment provider {name!r} is configured on this server")
    event = verify(provider, headers, body, now)
    with db.write() as s, s.begin():
        return post(s, event, now, settings.payment_max_amount)
