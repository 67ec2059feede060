"""Money never goes wrong: ledger invariants, exactly-once per-second metering, price book validation."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from suanli.billing import (
    EXTERNAL,
    PROMOTIONS,
    REVENUE,
    ZERO,
    Ledger,
    LedgerError,
    PriceBook,
    billable_seconds,
    charges_due,
    cost_of,
    default_price_book,
    exact,
    org_account,
    recompute,
    shown,
    transfer,
)

amounts = st.decimals(min_value=Decimal("0.01"), max_value=Decimal("10000"), places=2)
rates = st.decimals(min_value=Decimal("0.01"), max_value=Decimal("500"), places=2)


# --- money ----------------------------------------------------------------------------------------------------
def test_floats_are_refused_and_amounts_are_exact() -> None:
    with pytest.raises(TypeError):
        exact(0.1)  # type: ignore[arg-type]
    assert exact("0.1") + exact("0.2") == exact("0.3")
    assert shown(exact("10")) == "10.00"
    assert shown(exact("2.675")) == "2.68"  # banker's rounding on an exact decimal
    with pytest.raises(ValueError):
        exact("NaN")


# --- ledger ---------------------------------------------------------------------------------------------------
ops = st.lists(
    st.tuples(st.sampled_from(["topup", "trial", "charge", "refund"]), st.sampled_from(["a", "b", "c"]), amounts),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(ops)
def test_ledger_stays_balanced_and_recomputable(sequence: list[tuple[str, str, Decimal]]) -> None:
    ledger = Ledger()
    for i, (op, org, amount) in enumerate(sequence):
        acct = org_account(org)
        source, target, kind = {
            "topup": (EXTERNAL, acct, "topup"),
            "trial": (PROMOTIONS, acct, "trial_credit"),
            "charge": (acct, REVENUE, "usage"),
            "refund": (REVENUE, acct, "refund"),
        }[op]
        tx = transfer(f"t{i}", kind, source, target, amount)  # type: ignore[arg-type]
        try:
            ledger = ledger.post(tx)
        except LedgerError as e:
            assert "negative" in str(e)  # only an org going below zero may be refused
            continue
        # re-posting the same transaction (a retry after a crash) changes nothing
        assert ledger.post(tx) is ledger
    assert sum(ledger.balances.values(), ZERO) == ZERO
    assert recompute(ledger.transactions.values()) == dict(ledger.balances)
    for org in "abc":
        assert ledger.balance(org_account(org)) >= ZERO


def test_reusing_a_key_for_another_transaction_is_an_error() -> None:
    ledger = Ledger().post(transfer("k", "topup", EXTERNAL, org_account("a"), Decimal("5")))
    with pytest.raises(LedgerError, match="already used"):
        ledger.post(transfer("k", "topup", EXTERNAL, org_account("a"), Decimal("6")))


def test_unbalanced_or_empty_transactions_are_refused() -> None:
    from suanli.billing import Entry, Transaction

    with pytest.raises(LedgerError, match="sum"):
        Transaction("x", "adjustment", (Entry("a", Decimal("1")), Entry("b", Decimal("-2"))))
    with pytest.raises(LedgerError, match="positive"):
        transfer("y", "topup", EXTERNAL, org_account("a"), Decimal("0"))
    with pytest.raises(LedgerError, match="same account"):
        transfer("z", "topup", "x", "x", Decimal("1"))


def test_usage_beyond_the_balance_needs_an_explicit_allowance() -> None:
    ledger = Ledger().post(transfer("t", "trial_credit", PROMOTIONS, org_account("a"), Decimal("10")))
    charge = transfer("u", "usage", org_account("a"), REVENUE, Decimal("12"))
    with pytest.raises(LedgerError, match="negative"):
        ledger.post(charge)
    after = ledger.post(charge, allow_negative=(org_account("a"),))
    assert after.balance(org_account("a")) == Decimal("-2")


# --- metering ---------------------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    rate=rates,
    duration=st.floats(min_value=0.0, max_value=20_000.0, allow_nan=False),
    cuts=st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=12),
    window=st.sampled_from([1, 7, 60, 300]),
)
def test_every_second_is_charged_exactly_once(rate: Decimal, duration: float, cuts: list[float], window: int) -> None:
    """However often the metering loop looks (and repeats itself after crashes), the total is C(billed seconds)."""
    posted: dict[str, Decimal] = {}
    for t in sorted(c * duration for c in cuts):
        for charge in charges_due(
            "a", rate, t, stopped=False, charged_windows={int(k.rsplit(":", 1)[1]) for k in posted}, window_s=window
        ):
            assert charge.key not in posted
            posted[charge.key] = charge.amount
        # a crash before the watermark was saved: the same call again yields only keys already posted
        for charge in charges_due("a", rate, t, stopped=False, window_s=window):
            assert charge.key in posted and posted[charge.key] == charge.amount
    for charge in charges_due(
        "a", rate, duration, stopped=True, charged_windows={int(k.rsplit(":", 1)[1]) for k in posted}, window_s=window
    ):
        posted[charge.key] = charge.amount
    assert sum(posted.values(), ZERO) == cost_of(rate, billable_seconds(duration, stopped=True))


def test_rounding_rule_bills_the_elapsed_time_to_the_nearest_second_at_least_one() -> None:
    """A 7.01 s run pays 7 s (it paid 8: every started second), 7.5 s pays 8, anything under a second pays one."""
    assert billable_seconds(7.01, stopped=True) == 7
    assert billable_seconds(7.49, stopped=True) == 7
    assert billable_seconds(7.5, stopped=True) == 8
    assert billable_seconds(59.2, stopped=True) == 59
    assert billable_seconds(59.2, stopped=False) == 59
    assert billable_seconds(0.2, stopped=True) == 1 and billable_seconds(0.000001, stopped=True) == 1
    assert billable_seconds(0, stopped=True) == 0  # never ran: nothing
    assert billable_seconds(60.0000000001, stopped=True) == 60  # float noise is not a new second
    assert billable_seconds(7.4999999999, stopped=True) == 8  # ... nor half a second short of one
    assert cost_of(Decimal("36"), 1) == Decimal("0.01")  # 36 per hour = 1 cent per second
    with pytest.raises(ValueError):
        billable_seconds(-1, stopped=True)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0.0, max_value=10**7, allow_nan=False))
def test_what_runs_is_never_billed_beyond_the_final_bill(elapsed: float) -> None:
    """The completed seconds charged while live never exceed what the stop bills, so rounding never refunds."""
    assert billable_seconds(elapsed, stopped=False) <= billable_seconds(elapsed, stopped=True)
    assert abs(billable_seconds(elapsed, stopped=True) - elapsed) <= 0.5 + 1e-6 or elapsed < 1


# --- price book -----------------------------------------------------------------------------------------------
def test_default_price_book_prices_every_catalog_gpu() -> None:
    from suanli import catalog

    book = default_price_book()
    for gpu in catalog.all_gpus():
        on_demand = book.rate(gpu.name, 8)
        assert on_demand > ZERO
        assert book.rate(gpu.name, 8, "spot") < on_demand
        assert book.rate(gpu.name, 1, milli=142) < book.rate(gpu.name, 1)
    for plan, p in book.plans.items():
        per_hour = book.plan_price(plan, "H100-SXM", 8) / p.hours
        assert per_hour <= book.rate("H100-SXM", 8)


def test_price_book_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"gpu_hour\.H100"):
        PriceBook.model_validate({"gpu_hour": {"H100": "-1"}})
    with pytest.raises(ValidationError, match="spot_factor"):
        PriceBook.model_validate({"gpu_hour": {"H100": "1"}, "spot_factor": "2"})
    with pytest.raises(KeyError, match="no price for GPU model"):
        default_price_book().rate("TPU-v5")


# --- quotes -----------------------------------------------------------------------------------------------------
def _job():
    from suanli.perf import TrainJob, model_preset

    return TrainJob(model_preset("llama3.1-8b"), "bf16", 4096, 256)


def test_quotes_rank_by_cost_or_time_and_mark_availability() -> None:
    from suanli.billing.quotes import Offer, quote
    from suanli.topology import load_preset

    offers = [Offer(load_preset("16x8:H100"), 16), Offer(load_preset("h20-roce800-128"), 128)]
    cheapest = quote(_job(), 1e9, offers, default_price_book())
    assert cheapest and [q.cost for q in cheapest] == sorted(q.cost for q in cheapest)
    fastest = quote(_job(), 1e9, offers, default_price_book(), rank="fastest")
    assert [q.total_time_s for q in fastest] == sorted(q.total_time_s for q in fastest)
    for q in cheapest:
        assert q.available_now == (q.gpus <= (16 if q.gpu == "H100-SXM" else 128))
        # cost is the hourly rate times the predicted time
        assert abs(float(q.cost) - float(q.rate_per_hour) * q.total_time_s / 3600) < 0.01


def test_a_slow_network_makes_the_same_job_cost_more() -> None:
    from suanli.billing.quotes import Offer, quote
    from suanli.topology import load_preset

    book = default_price_book()
    fast = quote(_job(), 1e9, [Offer(load_preset("h20-roce800-128"), 128)], book, gpus=128)
    slow = quote(_job(), 1e9, [Offer(load_preset("h20-eth25g-128"), 128)], book, gpus=128)
    assert fast and slow and slow[0].cost > fast[0].cost and slow[0].total_time_s > fast[0].total_time_s


def test_an_org_below_zero_can_still_be_topped_up() -> None:
    a = org_account("a")
    ledger = Ledger().post(transfer("u", "usage", a, REVENUE, Decimal("4")), allow_negative=(a,))
    ledger = ledger.post(transfer("t", "topup", EXTERNAL, a, Decimal("3")))
    assert ledger.balance(a) == Decimal("-1")
