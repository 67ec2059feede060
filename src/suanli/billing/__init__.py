"""Money: exact amounts, the double-entry ledger, per-second metering and the price book. Pure."""

from suanli.billing.ledger import (
    EXTERNAL,
    PROMOTIONS,
    REVENUE,
    Entry,
    Ledger,
    LedgerError,
    Transaction,
    org_account,
    recompute,
    transfer,
)
from suanli.billing.metering import Charge, billable_seconds, charges_due, cost_of
from suanli.billing.money import ZERO, exact, shown
from suanli.billing.prices import PlanPrice, PriceBook, default_price_book
from suanli.billing.quotes import Offer, Quote, quote

__all__ = [
    "EXTERNAL",
    "PROMOTIONS",
    "REVENUE",
    "ZERO",
    "Charge",
    "Entry",
    "Ledger",
    "LedgerError",
    "Offer",
    "PlanPrice",
    "PriceBook",
    "Quote",
    "Transaction",
    "billable_seconds",
    "charges_due",
    "cost_of",
    "default_price_book",
    "exact",
    "org_account",
    "quote",
    "recompute",
    "shown",
    "transfer",
]
