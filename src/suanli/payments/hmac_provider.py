"""The generic provider ("hmac"): an HMAC-SHA256 signature over a timestamp and the raw body, as Stripe signs.

Header `Suanli-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`; several `v1=` values may be
given (a secret being rolled over). The body is JSON: `{"id": "evt_…", "org": "org_…", "amount": "100.00",
"currency": "CNY"}`, the amount a string of digits with at most two decimals. A timestamp more than `tolerance_s`
from the server's clock (either way) is refused, so a captured request cannot be replayed later; within the
tolerance, a replay is the same event id and posts nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal

from suanli.payments.base import EventError, PaymentProvider, SignatureError, TopUpEvent

HEADER = "Suanli-Signature"
AMOUNT = re.compile(r"[0-9]{1,12}(\.[0-9]{1,2})?")
EVENT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
CURRENCY = re.compile(r"[A-Z]{3}")
STAMP = re.compile(r"[0-9]{1,12}")


def signature(secret: str, body: bytes, timestamp: int) -> str:
    return hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The header value a sender puts on `body` at `timestamp` (for the provider's side, scripts and tests)."""
    return f"t={timestamp},v1={signature(secret, body, timestamp)}"


class HmacProvider(PaymentProvider):
    name = "hmac"

    def __init__(self, secret: str, tolerance_s: int = 300) -> None:
        self._secret = secret
        self.tolerance_s = tolerance_s

    def __repr__(self) -> str:  # the secret never reaches a log
        return f"HmacProvider(tolerance_s={self.tolerance_s})"

    def verify(self, headers: Mapping[str, str], body: bytes, now: datetime) -> TopUpEvent:
        timestamp, given = _parse_header(headers.get(HEADER) or headers.get(HEADER.lower()) or "")
        expected = signature(self._secret, body, timestamp)
        if not any(hmac.compare_digest(expected.encode(), g.encode()) for g in given):  # bytes: any text compares
            raise SignatureError(f"{HEADER}: the signature does not match the body")
        if abs(now.timestamp() - timestamp) > self.tolerance_s:
            raise SignatureError(f"{HEADER}: timestamp more than {self.tolerance_s} s from the server's clock")
        return _event(body)


def _parse_header(value: str) -> tuple[int, list[str]]:
    parts = [p.partition("=") for p in value.split(",")]
    stamps = [v for k, _, v in parts if k.strip() == "t"]
    given = [v.strip() for k, _, v in parts if k.strip() == "v1"]
    if len(stamps) != 1 or not STAMP.fullmatch(stamps[0].strip()) or not given:  # ASCII digits: not "²"
        raise SignatureError(f"{HEADER}: missing or malformed (t=<unix seconds>,v1=<hex HMAC-SHA256>)")
    return int(stamps[0]), given


def _event(body: bytes) -> TopUpEvent:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise EventError(f"body: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise EventError("body: a JSON object with id, org, amount, currency")
    event_id, org, amount, currency = (doc.get(k) for k in ("id", "org", "amount", "currency"))
    if not isinstance(event_id, str) or not EVENT_ID.fullmatch(event_id):
        raise EventError("id: 1-128 of A-Z a-z 0-9 _ . : -")
    if not isinstance(org, str) or len(org) > 64:
        raise EventError("org: the organisation's id (org_…)")
    if not isinstance(amount, str) or not AMOUNT.fullmatch(amount):
        raise EventError('amount: a string of digits with at most two decimals, e.g. "100.00"')
    if not isinstance(currency, str) or not CURRENCY.fullmatch(currency):
        raise EventError("currency: an ISO 4217 code, e.g. CNY")
    return TopUpEvent(HmacProvider.name, event_id, org, Decimal(amount), currency)
