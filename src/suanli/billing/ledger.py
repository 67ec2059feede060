"""Double-entry ledger: every movement of money is a balanced transaction with an idempotency key.

Pure: the ledger is a value; posting returns a new ledger or raises. The database layer stores the same
transactions and entries and uses these functions to validate them and to recompute balances.

Sign convention: an entry's amount is added to its account. Money enters the platform from `external`
(cash top-ups, card payments) or from `promotions` (trial credit, fault credits), tenants' `org:<id>`
accounts hold prepaid balances, and usage moves money from an org to `revenue`. Every transaction sums to
zero, so the sum over all accounts is always zero and any balance can be recomputed from the entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from suanli.billing.money import ZERO, exact

Kind = Literal["trial_credit", "topup", "usage", "refund", "credit", "plan_purchase", "adjustment"]
EXTERNAL = "external"
PROMOTIONS = "promotions"
REVENUE = "revenue"


def org_account(org_id: str) -> str:
    return f"org:{org_id}"


class LedgerError(ValueError):
    """A transaction that would break the ledger's rules."""


@dataclass(frozen=True)
class Entry:
    account: str
    amount: Decimal


@dataclass(frozen=True)
class Transaction:
    key: str  # idempotency key: posting the same key twice is a no-op, posting it with other entries an error
    kind: Kind
    entries: tuple[Entry, ...]
    memo: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            raise LedgerError("a transaction needs an idempotency key")
        if len(self.entries) < 2:
            raise LedgerError(f"{self.key}: a transaction needs at least two entries")
        total = sum((e.amount for e in self.entries), ZERO)
        if total != ZERO:
            raise LedgerError(f"{self.key}: entries sum to {total}, not 0")
        if any(e.amount == ZERO for e in self.entries):
            raise LedgerError(f"{self.key}: zero-amount entry")

    def same_as(self, other: Transaction) -> bool:
        return (self.kind, sorted((e.account, e.amount) for e in self.entries)) == (
            other.kind,
            sorted((e.account, e.amount) for e in other.entries),
        )


def transfer(key: str, kind: Kind, source: str, target: str, amount: Decimal, memo: str = "") -> Transaction:
    """Move a positive `amount` from `source` to `target`."""
    amount = exact(amount)
    if amount <= ZERO:
        raise LedgerError(f"{key}: amount must be positive, got {amount}")
    if source == target:
        raise LedgerError(f"{key}: source and target are the same account")
    return Transaction(key, kind, (Entry(source, -amount), Entry(target, amount)), memo)


@dataclass(frozen=True)
class Ledger:
    """Posted transactions and the balances they imply."""

    transactions: Mapping[str, Transaction] = field(default_factory=dict)
    balances: Mapping[str, Decimal] = field(default_factory=dict)

    def balance(self, account: str) -> Decimal:
        return self.balances.get(account, ZERO)

    def post(self, tx: Transaction, *, allow_negative: Iterable[str] = (EXTERNAL, PROMOTIONS)) -> Ledger:
        """Apply `tx` once. Re-posting an identical transaction returns the ledger unchanged.

        Org accounts may not go below zero unless listed in `allow_negative` (usage charges are admitted
        against a hold, so the metering service passes the org's account there)."""
        seen = self.transactions.get(tx.key)
        if seen is not None:
            if seen.same_as(tx):
                return self
            raise LedgerError(f"idempotency key {tx.key!r} was already used for a different transaction")
        balances = dict(self.balances)
        for e in tx.entries:
            balances[e.account] = balances.get(e.account, ZERO) + e.amount
        negative_ok = set(allow_negative)
        for e in tx.entries:  # only a debit may take an org below zero; credits (top-ups, refunds) always post
            if (
                e.amount < ZERO
                and e.account.startswith("org:")
                and balances[e.account] < ZERO
                and e.account not in negative_ok
            ):
                raise LedgerError(f"{tx.key}: {e.account} would go negative ({balances[e.account]})")
        return Ledger({**self.transactions, tx.key: tx}, balances)


def recompute(transactions: Iterable[Transaction]) -> dict[str, Decimal]:
    """Balances from entries alone: what a database check recomputes and compares."""
    out: dict[str, Decimal] = {}
    for tx in transactions:
        for e in tx.entries:
            out[e.account] = out.get(e.account, ZERO) + e.amount
    return out
