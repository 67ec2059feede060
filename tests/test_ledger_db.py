"""The ledger in the database against the pure model: random sequences of money movements on both backends.

Every step posts through `control.money.ledger` (top-ups, credits, refunds, usage charges, plan purchases that may be
refused, idempotency keys reused on purpose) and mirrors the call on the pure `billing.ledger.Ledger`. After each
step the stored ledger must equal the model: every balance, every transaction, the running balances equal the
sums of their entries (`recompute`), and all accounts sum to zero.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from sqlalchemy import delete, func, select

from suanli.billing.ledger import (
    EXTERNAL,
    PROMOTIONS,
    REVENUE,
    Entry,
    Ledger,
    LedgerError,
    Transaction,
    org_account,
    transfer,
)
from suanli.billing.money import ZERO
from suanli.control.accounts import accounts
from suanli.control.errors import Conflict, Invalid, PaymentRequired
from suanli.control.money import ledger
from suanli.db.engine import Database
from suanli.db.models import AccountBalance, LedgerEntry, LedgerTransaction

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SOURCES = {"topup": EXTERNAL, "credit": PROMOTIONS, "refund": REVENUE}
AMOUNTS = st.decimals(min_value=Decimal("0.00000001"), max_value=Decimal("500"), places=8)
KEYS = st.integers(0, 11).map(lambda n: f"k{n}")  # a small pool, so keys collide often


def make_orgs(db: Database, n: int) -> list[str]:
    with db.write() as s, s.begin():
        return [accounts.create_user(s, f"u{i}@example.com", "password123", T0)[1].id for i in range(n)]


def ledger_machine(db: Database, orgs: list[str]) -> type[RuleBasedStateMachine]:
    class LedgerMachine(RuleBasedStateMachine):
        """One example: an empty ledger, then random movements; the model says what each must do."""

        @initialize()
        def empty(self) -> None:
            with db.write() as s, s.begin():
                for table in (LedgerEntry, LedgerTransaction, AccountBalance):
                    s.execute(delete(table))
            self.model = Ledger()
            self.clock = T0

        def _post(self, tx: Transaction, org: str, allow_negative: tuple[str, ...], use_move: bool) -> None:
            """Post on both sides; the refusal the model predicts must happen, and write nothing."""
            self.clock += timedelta(seconds=1)
            seen = self.model.transactions.get(tx.key)
            try:
                expected = self.model.post(tx, allow_negative=(EXTERNAL, PROMOTIONS, *allow_negative))
                error: type[Exception] | None = None
            except LedgerError:
                expected, error = self.model, (PaymentRequired if seen is None else Conflict)
            with db.write() as s, s.begin():  # errors are caught INSIDE the transaction, which then commits
                try:
                    if use_move:
                        amount = tx.entries[1].amount
                        row, created = ledger.move(s, tx.kind, org, amount, tx.key, self.clock, tx.memo)
                    else:
                        row, created = ledger.post(s, tx, self.clock, org_id=org, allow_negative=allow_negative)
                except (PaymentRequired, Conflict) as e:
                    assert type(e) is error, f"{tx}: got {e!r}, model expected {error}"
                else:
                    assert error is None, f"{tx}: posted, model expected {error}"
                    assert created == (seen is None) and row.key == tx.key
            self.model = expected

        @rule(kind=st.sampled_from(sorted(SOURCES)), i=st.integers(0, 1), amount=AMOUNTS, key=KEYS, move=st.booleans())
        def money_in(self, kind: str, i: int, amount: Decimal, key: str, move: bool) -> None:
            tx = transfer(key, kind, SOURCES[kind], org_account(orgs[i]), amount, kind)  # type: ignore[arg-type]
            self._post(tx, orgs[i], (), move)

        @rule(i=st.integers(0, 1), amount=AMOUNTS, key=KEYS)
        def usage(self, i: int, amount: Decimal, key: str) -> None:
            """Usage is admitted against a hold: the org may go below zero."""
            tx = transfer(key, "usage", org_account(orgs[i]), REVENUE, amount, "usage")
            self._post(tx, orgs[i], (org_account(orgs[i]),), False)

        @rule(i=st.integers(0, 1), amount=AMOUNTS, key=KEYS)
        def purchase(self, i: int, amount: Decimal, key: str) -> None:
            """A plan purchase must be covered by the balance: refused with 402 otherwise."""
            tx = transfer(key, "plan_purchase", org_account(orgs[i]), REVENUE, amount, "plan")
            self._post(tx, orgs[i], (), False)

        @rule(data=st.data())
        def repeat(self, data: st.DataObject) -> None:
            """Re-post a stored key exactly (a no-op) or with one cent more (a conflict)."""
            if not self.model.transactions:
                return
            tx = self.model.transactions[data.draw(st.sampled_from(sorted(self.model.transactions)))]
            org = next(e.account.removeprefix("org:") for e in tx.entries if e.account.startswith("org:"))
            if data.draw(st.booleans()):
                tx = Transaction(tx.key, tx.kind, tuple(Entry(e.account, e.amount * 2) for e in tx.entries), tx.memo)
            negative = (org_account(org),) if tx.kind == "usage" else ()
            self._post(tx, org, negative, False)

        @rule(i=st.integers(0, 1), amount=st.sampled_from(["0", "-1", "1000000001", "abc"]))
        def invalid_move(self, i: int, amount: str) -> None:
            with db.write() as s, s.begin(), pytest.raises(Invalid):
                ledger.move(s, "topup", orgs[i], amount, "bad", self.clock)

        @invariant()
        def stored_equals_model(self) -> None:
            with db.read() as s:
                assert ledger.recompute(s) == {}
                stored = dict(s.execute(select(AccountBalance.account, AccountBalance.balance)).all())
                for account in set(stored) | set(self.model.balances):
                    assert stored.get(account, ZERO) == self.model.balance(account), account
                assert sum(stored.values(), ZERO) == ZERO
                for org in orgs:
                    assert ledger.org_balance(s, org) == self.model.balance(org_account(org))
                keys = set(s.scalars(select(LedgerTransaction.key)))
                assert keys == set(self.model.transactions)
                assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 2 * len(keys)

    return LedgerMachine


def test_ledger_matches_the_model(db: Database) -> None:
    machine = ledger_machine(db, make_orgs(db, 2))
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )


def test_refused_purchase_writes_nothing_even_when_the_caller_commits(db: Database) -> None:
    """A 402 inside a larger transaction leaves no transaction row, entries or balance moves behind."""
    (org,) = make_orgs(db, 1)
    with db.write() as s, s.begin():
        ledger.move(s, "topup", org, "5", "top", T0)
        with pytest.raises(PaymentRequired, match="negative"):
            ledger.post(s, transfer("buy", "plan_purchase", org_account(org), REVENUE, Decimal("5.01")), T0)
        ledger.post(s, transfer("buy2", "plan_purchase", org_account(org), REVENUE, Decimal("2")), T0)
    with db.read() as s:
        assert ledger.org_balance(s, org) == Decimal("3")
        assert ledger.balance(s, REVENUE) == Decimal("2")
        assert set(s.scalars(select(LedgerTransaction.key))) == {"top", "buy2"}
        assert ledger.recompute(s) == {}


@pytest.mark.parametrize("same", [True, False])
def test_a_key_raced_by_two_sessions_is_posted_once(db: Database, same: bool) -> None:
    """B posts a key A has inserted but not committed: B waits (PostgreSQL: on the unique index, then takes the
    IntegrityError path; SQLite: at BEGIN) and finds A's transaction: a no-op if the same, a 409 if not. B's own
    transaction stays usable after the race."""
    (org,) = make_orgs(db, 1)
    usage = transfer("race", "usage", org_account(org), REVENUE, Decimal("1.5"))
    other = usage if same else transfer("race", "usage", org_account(org), REVENUE, Decimal("2.5"))
    outcome: dict[str, Any] = {}

    def b() -> None:
        with db.write() as s, s.begin():
            try:
                outcome["created"] = ledger.post(s, other, T0, org_id=org, allow_negative=[org_account(org)])[1]
            except Conflict as e:
                outcome["error"] = e
            ledger.move(s, "credit", org, "1", "after-race", T0)

    with db.write() as s, s.begin():
        ledger.post(s, usage, T0, org_id=org, allow_negative=[org_account(org)])
        racer = threading.Thread(target=b)
        racer.start()
        racer.join(0.5)  # B is now waiting for A (or, slower, has not reached the key yet: the same outcome)
    racer.join(30)
    assert (outcome == {"created": False}) if same else isinstance(outcome.get("error"), Conflict)
    with db.read() as s:
        assert ledger.org_balance(s, org) == Decimal("-0.5") and ledger.recompute(s) == {}
        assert set(s.scalars(select(LedgerTransaction.key))) == {"race", "after-race"}


def test_recompute_reports_a_tampered_balance_and_an_unbalanced_transaction(db: Database) -> None:
    """The check the property test relies on does catch drift: it is not vacuously empty."""
    (org,) = make_orgs(db, 1)
    with db.write() as s, s.begin():
        tx, _ = ledger.move(s, "topup", org, "7", "top", T0)
        s.flush()
        s.execute(AccountBalance.__table__.update().where(AccountBalance.account == org_account(org)).values(balance=8))
        s.add(LedgerEntry(tx_id=tx.id, account=REVENUE, amount=Decimal("1")))
    with db.read() as s:
        bad = ledger.recompute(s)
    assert bad[org_account(org)] == (Decimal("8"), Decimal("7"))
    assert bad[REVENUE] == (ZERO, Decimal("1"))
    assert bad["tx:top"] == (Decimal("1"), ZERO)
