"""The ledger in the database: post balanced transactions exactly once, read and recompute balances.

`post` validates with the pure `billing.ledger` rules, inserts the transaction and its entries, and moves the
running balances in the same database transaction; its idempotency key is unique, so a retry (or a second
process racing on the same key) posts nothing twice. On PostgreSQL the balance rows are updated with
`UPDATE … RETURNING`, whose row locks serialise concurrent charges to one org; on SQLite writers are
serialised by the write lock every writing session takes at BEGIN.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from suanli.billing.ledger import (
    EXTERNAL,
    PROMOTIONS,
    REVENUE,
    Entry,
    LedgerError,
    Transaction,
    org_account,
    transfer,
)
from suanli.billing.money import ZERO, exact
from suanli.control.errors import Conflict, Invalid, PaymentRequired
from suanli.db.models import (
    AccountBalance,
    Allocation,
    LedgerEntry,
    LedgerTransaction,
    Membership,
    Org,
    PriceBookVersion,
)

MAX_AMOUNT = Decimal("1000000000")  # one top-up or credit; larger is a typo, not a payment


def _as_transaction(row: LedgerTransaction) -> Transaction:
    return Transaction(row.key, row.kind, tuple(Entry(e.account, exact(e.amount)) for e in row.entries), row.memo)  # type: ignore[arg-type]


def _ensure_accounts(s: Session, accounts: Iterable[str]) -> None:
    ins = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    rows = [{"account": a, "balance": ZERO} for a in sorted(set(accounts))]
    s.execute(ins(AccountBalance).values(rows).on_conflict_do_nothing(index_elements=["account"]))


def post(
    s: Session,
    tx: Transaction,
    now: datetime,
    *,
    org_id: str | None = None,
    user_id: str | None = None,
    allocation_id: str | None = None,
    allow_negative: Iterable[str] = (),
) -> tuple[LedgerTransaction, bool]:
    """Post `tx` once; returns the stored transaction and whether this call created it.

    An org account may go below zero only if listed in `allow_negative` (usage admitted against a hold);
    otherwise the whole transaction is refused with 402 and nothing is written."""
    existing = s.scalar(select(LedgerTransaction).where(LedgerTransaction.key == tx.key))
    if existing is not None:
        return _same_or_conflict(existing, tx), False
    row = LedgerTransaction(
        key=tx.key, kind=tx.kind, memo=tx.memo, org_id=org_id, user_id=user_id, allocation_id=allocation_id,
        created_at=now,
    )  # fmt: skip
    negative_ok = {EXTERNAL, PROMOTIONS, REVENUE, *allow_negative}
    try:
        # One savepoint around every write: a refusal (402) or a lost key race leaves nothing behind, even when
        # the caller catches the error and commits the rest of its transaction.
        with s.begin_nested():
            s.add(row)
            s.flush()
            _ensure_accounts(s, (e.account for e in tx.entries))
            for e in tx.entries:
                s.add(LedgerEntry(tx_id=row.id, account=e.account, amount=e.amount))
            # Balance rows are locked (updated) in account order, so two transactions that touch the same accounts
            # in opposite directions (a charge and a refund) cannot deadlock on PostgreSQL.
            for e in sorted(tx.entries, key=lambda e: e.account):
                new = s.execute(
                    update(AccountBalance)
                    .where(AccountBalance.account == e.account)
                    .values(balance=AccountBalance.balance + e.amount)
                    .returning(AccountBalance.balance)
                ).scalar_one()
                if e.amount < ZERO and e.account.startswith("org:") and new < ZERO and e.account not in negative_ok:
                    raise PaymentRequired(f"{tx.memo or tx.kind}: balance would go negative ({exact(new)})")
            s.flush()
    except IntegrityError:  # another process posted the same key between our read and our insert
        existing = s.scalar(select(LedgerTransaction).where(LedgerTransaction.key == tx.key))
        if existing is None:
            raise
        return _same_or_conflict(existing, tx), False
    return row, True


def _same_or_conflict(existing: LedgerTransaction, tx: Transaction) -> LedgerTransaction:
    if not _as_transaction(existing).same_as(tx):
        raise Conflict(f"idempotency key {tx.key!r} was already used for a different transaction")
    return existing


def balance(s: Session, account: str) -> Decimal:
    value = s.scalar(select(AccountBalance.balance).where(AccountBalance.account == account))
    return exact(value) if value is not None else ZERO


def org_balance(s: Session, org_id: str) -> Decimal:
    return balance(s, org_account(org_id))


def move(
    s: Session,
    kind: str,
    org_id: str,
    amount: Decimal | str,
    key: str,
    now: datetime,
    memo: str = "",
    user_id: str | None = None,
) -> tuple[LedgerTransaction, bool]:
    """Operator movements: top-up (cash in), credit (a goodwill credit), refund (usage given back)."""
    try:
        amount = exact(amount)
    except (TypeError, ValueError) as e:
        raise Invalid(f"amount: {e}") from e
    if not ZERO < amount <= MAX_AMOUNT:
        raise Invalid(f"amount: must be > 0 and <= {MAX_AMOUNT}")
    source = {"topup": EXTERNAL, "credit": PROMOTIONS, "refund": REVENUE}.get(kind)
    if source is None:
        raise Invalid("kind: one of topup, credit, refund")
    try:
        tx = transfer(key, kind, source, org_account(org_id), amount, memo or kind)  # type: ignore[arg-type]
    except LedgerError as e:
        raise Invalid(str(e)) from e
    return post(s, tx, now, org_id=org_id, user_id=user_id)


def net_for_org(tx: LedgerTransaction, org_id: str) -> Decimal:
    """What a transaction did to one org's balance."""
    acct = org_account(org_id)
    return sum((exact(e.amount) for e in tx.entries if e.account == acct), ZERO)


def transactions(s: Session, org_id: str, limit: int = 100, before_id: int | None = None) -> list[LedgerTransaction]:
    q = select(LedgerTransaction).where(LedgerTransaction.org_id == org_id)
    if before_id is not None:
        q = q.where(LedgerTransaction.id < before_id)
    return list(s.scalars(q.order_by(LedgerTransaction.id.desc()).limit(limit)))


def recompute(s: Session) -> dict[str, tuple[Decimal, Decimal]]:
    """Accounts whose running balance differs from the sum of their entries: {account: (stored, summed)}.
    Also checks that every transaction balances (reported under the key `tx:<key>`)."""
    summed = dict(
        s.execute(select(LedgerEntry.account, func.sum(LedgerEntry.amount)).group_by(LedgerEntry.account)).all()
    )
    stored = dict(s.execute(select(AccountBalance.account, AccountBalance.balance)).all())
    bad: dict[str, tuple[Decimal, Decimal]] = {}
    for acct in set(summed) | set(stored):
        a, b = exact(stored.get(acct) or ZERO), exact(summed.get(acct) or ZERO)
        if a != b:
            bad[acct] = (a, b)
    unbalanced = s.execute(
        select(LedgerTransaction.key, func.sum(LedgerEntry.amount))
        .join(LedgerEntry, LedgerEntry.tx_id == LedgerTransaction.id)
        .group_by(LedgerTransaction.key)
        .having(func.sum(LedgerEntry.amount) != 0)
    ).all()
    for key, total in unbalanced:
        bad[f"tx:{key}"] = (exact(total), ZERO)
    return bad


@dataclass(frozen=True)
class BalanceView:
    member: bool
    org_exists: bool
    balance: Decimal
    held_per_hour: Decimal
    price_version: int


def _balance_view_statement() -> Any:
    org, user, acct = bindparam("org_id"), bindparam("user_id"), bindparam("account")
    return select(
        select(Membership.role).where(Membership.org_id == org, Membership.user_id == user).scalar_subquery(),
        select(Org.id).where(Org.id == org).scalar_subquery(),
        select(AccountBalance.balance).where(AccountBalance.account == acct).scalar_subquery(),
        select(func.sum(Allocation.rate_per_hour))
        .where(Allocation.org_id == org, Allocation.stopped_at.is_(None))
        .scalar_subquery(),
        select(func.max(PriceBookVersion.id)).scalar_subquery(),
    )


_BALANCE_VIEW = _balance_view_statement()  # built once: the hot read path is one precompiled statement


def balance_view_query(org_id: str, user_id: str) -> tuple[Any, dict[str, str]]:
    """Everything `GET /orgs/{id}/balance` needs in one round trip: access, balance, running rate, price version
    (one row: read it with `balance_view_of`)."""
    return _BALANCE_VIEW, {"org_id": org_id, "user_id": user_id, "account": org_account(org_id)}


def balance_view_of(row: Sequence[Any]) -> BalanceView:
    role, org, bal, held, version = row
    return BalanceView(role is not None, org is not None, exact(bal or ZERO), exact(held or ZERO), version or 0)


def balance_view(s: Session | Connection, org_id: str, user_id: str) -> BalanceView:
    return balance_view_of(s.execute(*balance_view_query(org_id, user_id)).one())
