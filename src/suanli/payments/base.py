"""The payment provider interface: verify a webhook's signature and read the top-up it announces.

An adapter does no I/O and keeps no state: it is given the request's headers, its raw body (the bytes the signature
covers; never a re-serialised parse) and the time, and returns a `TopUpEvent` or raises. Replay protection is
shared: the adapter refuses timestamps outside its tolerance, and the services post each `(provider, event_id)` once,
whatever the adapter (the ledger's idempotency key `payment:<provider>:<event_id>`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal


class SignatureError(Exception):
    """The request is not provably from the provider: no, a malformed or a wrong signature, or a timestamp outside
    the tolerance (401; the provider's own retries are then refused too, which is what an operator wants to see)."""


class EventError(Exception):
    """Signed, but not an event this adapter can post (422): the message starts with the field at fault."""


@dataclass(frozen=True)
class TopUpEvent:
    """A payment the provider confirmed: `amount` (exact, in `currency`) paid into `org_id`."""

    provider: str
    event_id: str  # unique per provider: posting is idempotent by it
    org_id: str  # the org's id (`org_…`), as the checkout page put it in the payment's metadata
    amount: Decimal
    currency: str  # ISO 4217, e.g. CNY


class PaymentProvider(ABC):
    """One provider's webhook. `name` is the path segment of `POST /api/v1/payments/{name}/webhook`."""

    name: str

    @abstractmethod
    def verify(self, headers: Mapping[str, str], body: bytes, now: datetime) -> TopUpEvent:
        """The event this request announces; `SignatureError` unless its signature is good and fresh,
        `EventError` if it is signed but not a top-up this adapter understands. `headers` match case-insensitively
        (Starlette's `Headers`); `body` is the raw request body."""
