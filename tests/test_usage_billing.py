"""Pay by compute used, in the pure core: readings to permille, the activity integral (a missing reading never lowers
it), the charge U(S, A) (exact, rounded once, monotone in activity, between the floor and the full rate), its windows
(they add up to U of the whole run and use the per-second metering's keys and time rule), and the price book's usage
prices and floor; the spec's `billing: usage`."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from suanli.billing.metering import billable_seconds, charges_due, cost_of
from suanli.billing.prices import PriceBook
from suanli.billing.prices import default_price_book as shipped
from suanli.billing.usage import (
    FULL,
    UsageRates,
    activity,
    gpu_activity,
    permille,
    usage_cost,
    visible,
    window_cost,
    windows_due,
)
from suanli.control.errors import Invalid
from suanli.control.money import prices as control_prices
from suanli.workloads import SpecError, parse_spec

money = st.decimals(Decimal("0"), Decimal("5000"), places=8)
readings_st = st.lists(st.tuples(st.integers(-3000, 40_000), st.one_of(st.none(), st.integers(0, FULL))), max_size=25)


# ---- readings to permille -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("util", "error", "expected"),
    [
        (0.0, "", 0), (100.0, "", 1000), (37.25, "", 373), (37.24, "", 372), (0.05, "", 1), (0.049, "", 0),
        (99.96, "", 1000), (150.0, "", 1000), (-3.0, "", 0), (55.0, "GPU is lost", None), (math.nan, "", None),
        (math.inf, "", None), (-math.inf, "", None),
    ],
)  # fmt: skip
def test_a_reading_is_whole_permille_rounded_half_up_and_an_unreadable_one_is_none(
    util: float, error: str, expected: int | None
) -> None:
    assert permille(util, error) == expected


# ---- the activity integral ----------------------------------------------------------------------------------------
def brute(readings: list[tuple[int, int | None]], start: int, end: int, span: int, until: int | None) -> int:
    """The rule as the docs say it, second by second: the lowest reading that speaks for the second, else 1000."""
    total = 0
    for j in range(start, end):
        speaking = [p for u, p in readings if p is not None and u >= 0 and (until is None or u < until)
                    and u // 1000 - span < j <= u // 1000]  # fmt: skip
        total += min(speaking) if speaking else FULL
    return total


@settings(deadline=None)
@given(
    readings=readings_st,
    start=st.integers(0, 40),
    length=st.integers(0, 40),
    span=st.integers(1, 20),
    until=st.one_of(st.none(), st.integers(0, 45_000)),
)
def test_activity_is_the_documented_rule_second_by_second(
    readings: list[tuple[int, int | None]], start: int, length: int, span: int, until: int | None
) -> None:
    got = gpu_activity(readings, start, start + length, span, until)
    assert got == brute(readings, start, start + length, span, until)
    assert 0 <= got <= FULL * length


@settings(deadline=None)
@given(readings=readings_st, keep=st.lists(st.booleans(), max_size=25), span=st.integers(1, 20))
def test_the_tenant_cannot_lower_its_bill_by_hiding_readings(
    readings: list[tuple[int, int | None]], keep: list[bool], span: int
) -> None:
    """Whatever readings fail or vanish (on any of its GPUs), the activity never goes down."""
    kept = [r for r, k in zip(readings, keep + [True] * len(readings), strict=False) if k]
    assert gpu_activity(kept, 0, 40, span) >= gpu_activity(readings, 0, 40, span)
    assert gpu_activity([], 0, 40, span) == FULL * 40  # no reading at all: fully active


@settings(deadline=None)
@given(readings=readings_st, which=st.integers(0, 24), up=st.integers(0, FULL), span=st.integers(1, 20))
def test_a_busier_reading_never_lowers_the_activity(
    readings: list[tuple[int, int | None]], which: int, up: int, span: int
) -> None:
    if not readings or readings[which % len(readings)][1] is None:
        return
    i = which % len(readings)
    at, value = readings[i]
    busier = [*readings[:i], (at, max(value or 0, up)), *readings[i + 1 :]]
    assert gpu_activity(busier, 0, 40, span) >= gpu_activity(readings, 0, 40, span)


def test_activity_by_hand() -> None:
    """Readings every 5 s speaking for the 6 s they average (the second they are taken in and the 5 before it):
    seconds 5 and 10 hear two readings and take the lower; the seconds after the last reading hear none."""
    r = [(0, 900), (5000, 300), (10_000, 600)]
    assert gpu_activity(r, 0, 17, 6) == 6 * 300 + 5 * 600 + 6 * FULL  # 0 and 5 take the lower; 11..16: nobody
    assert gpu_activity(r, 0, 16, 6, until_ms=5000) == 900 + 15 * FULL  # readings after the stop: none
    assert gpu_activity([(-1, 0)], 0, 3, 6) == 3 * FULL  # read before the allocation started: someone else's
    assert activity([r, []], 0, 5, 6) == 5 * 300 + 5 * FULL  # a GPU without readings is fully active


def test_a_reading_speaks_for_the_interval_it_averages_not_the_one_after_it() -> None:
    """NVML's mean covers the interval before the reading: busy for 5 s and then idle, read at 5.2 s (busy) and at
    10.2 s (idle), the busy seconds are billed busy and the idle ones idle, not the other way round."""
    r = [(5200, FULL), (10_200, 0)]
    assert gpu_activity(r, 0, 5, 6) == 5 * FULL  # seconds 0..4: the busy reading's
    assert gpu_activity(r, 6, 10, 6) == 0  # seconds 6..9: the idle reading's
    assert gpu_activity(r, 11, 12, 6) == FULL  # second 11: no reading yet speaks for it
    with pytest.raises(ValueError):
        gpu_activity(r, 0, 5, 0)


# ---- the charge ---------------------------------------------------------------------------------------------------
@st.composite
def usage_rates(draw: st.DrawFn) -> UsageRates:
    full = draw(money)
    floor = draw(st.decimals(Decimal(0), full, places=8)) if full else Decimal(0)
    return UsageRates(full, floor, draw(st.decimals(Decimal(0), Decimal(100), places=8)), draw(st.integers(1, 64)))


@settings(deadline=None)
@given(rates=usage_rates(), seconds=st.integers(0, 10**6), share=st.fractions(0, 1))
def test_the_charge_is_the_formula_exactly_rounded_once_half_even(
    rates: UsageRates, seconds: int, share: Fraction
) -> None:
    a = math.floor(share * FULL * rates.gpus * seconds)
    got = usage_cost(rates, seconds, a)
    exact_value = (Fraction(rates.host + rates.floor) * seconds
                   + Fraction(rates.full - rates.floor) * a / (FULL * rates.gpus)) / 3600  # fmt: skip
    units = exact_value * 10**8
    nearest = round(units)  # half to even
    assert got == Decimal(nearest).scaleb(-8) and isinstance(got, Decimal)
    assert abs(units - nearest) <= Fraction(1, 2)


@settings(deadline=None)
@given(rates=usage_rates(), seconds=st.integers(0, 10**6), a=st.fractions(0, 1), b=st.fractions(0, 1))
def test_the_charge_rises_with_activity_and_lies_between_the_floor_and_the_full_rate(
    rates: UsageRates, seconds: int, a: Fraction, b: Fraction
) -> None:
    top = FULL * rates.gpus * seconds
    lo, hi = sorted((math.floor(a * top), math.floor(b * top)))
    assert usage_cost(rates, seconds, lo) <= usage_cost(rates, seconds, hi)
    floor = cost_of(rates.host + rates.floor, seconds)
    full = cost_of(rates.host + rates.full, seconds)
    assert floor <= usage_cost(rates, seconds, lo) <= usage_cost(rates, seconds, hi) <= full
    assert usage_cost(rates, seconds, 0) == floor  # idle: the floor, as per-second metering would charge it
    assert usage_cost(rates, seconds, top) == full  # fully active: the full rate, exactly the on-demand formula


def test_activity_out_of_range_is_refused() -> None:
    r = UsageRates(Decimal(10), Decimal(2), Decimal(0), 2)
    for seconds, a in ((-1, 0), (10, -1), (10, 2 * FULL * 10 + 1)):
        with pytest.raises(ValueError):
            usage_cost(r, seconds, a)
    for bad in (dict(full=Decimal(1), floor=Decimal(2)), dict(gpus=0), dict(host=Decimal(-1))):
        with pytest.raises(ValueError):
            UsageRates(**{"full": Decimal(10), "floor": Decimal(2), "host": Decimal(0), "gpus": 2, **bad})


@settings(deadline=None)
@given(
    rates=usage_rates(),
    cuts=st.lists(st.integers(1, 5000), max_size=8),
    shares=st.lists(st.fractions(0, 1), min_size=9, max_size=9),
)
def test_windows_add_up_to_the_charge_of_the_whole_run(
    rates: UsageRates, cuts: list[int], shares: list[Fraction]
) -> None:
    """However the run is split, and whatever each piece's activity, the pieces sum to U(S, A) exactly."""
    bounds = [0, *sorted(set(cuts))]
    total, before = Decimal(0), 0
    for (start, end), share in zip(itertools.pairwise(bounds), shares, strict=False):
        inside = math.floor(share * FULL * rates.gpus * (end - start))
        amount = window_cost(rates, start, end, before, inside)
        assert amount >= 0
        total, before = total + amount, before + inside
    assert total == usage_cost(rates, bounds[-1], before)


# ---- which windows are due ----------------------------------------------------------------------------------------
@settings(deadline=None)
@given(elapsed=st.floats(0, 5000), stopped=st.booleans(), window=st.sampled_from([1, 7, 60]))
def test_windows_are_per_second_meterings_windows_with_its_keys_and_time_rule(
    elapsed: float, stopped: bool, window: int
) -> None:
    """The same windows, keys and billed seconds as per-second metering of the same run: a change to the time rule
    (`billable_seconds`) reaches usage billing too."""
    windows, billed = windows_due("al_x", elapsed, stopped, 0, window)
    charges = charges_due("al_x", Decimal(3600), elapsed, stopped, window_s=window)  # 1 a second: no empty window
    assert [(w.key, w.start_s, w.end_s) for w in windows] == [(c.key, c.start_s, c.end_s) for c in charges]
    assert billed == billable_seconds(elapsed, stopped)


def test_windows_after_what_is_paid_start_there() -> None:
    windows, billed = windows_due("al_x", 200.5, True, 90, 60)
    assert [(w.window, w.start_s, w.end_s) for w in windows] == [(1, 90, 120), (2, 120, 180), (3, 180, 201)]
    assert billed == 201
    assert windows_due("al_x", 200.5, False, 180, 60) == ([], 200)  # live: only whole windows


def test_a_window_is_charged_delay_seconds_after_it_ends_and_a_run_settles_delay_after_it_stops() -> None:
    assert visible(100.0, False, 100.0, 30) == (70.0, False)  # live: as it stood 30 s ago
    assert visible(100.0, False, 10.0, 30) == (0.0, False)
    assert visible(50.0, True, 70.0, 30) == (40.0, False)  # stopped 20 s ago: not settled yet
    assert visible(50.0, True, 80.0, 30) == (50.0, True)  # stopped 30 s ago: settled
    assert visible(50.0, True, 50.0, 0) == (50.0, True)


# ---- the price book -----------------------------------------------------------------------------------------------
def test_the_shipped_book_prices_every_gpu_by_usage_above_on_demand_and_an_idle_gpu_below_it() -> None:
    b = shipped()
    assert set(b.usage_gpu_hour) == set(b.gpu_hour) and b.usage_floor == Decimal("0.2")
    for model, on_demand in b.gpu_hour.items():
        assert b.usage_gpu_hour[model] == on_demand * Decimal("1.25")
        assert b.rate(model, 8, "usage") == 8 * b.usage_gpu_hour[model]
        assert b.usage_floor_rate(model, 8) == on_demand * 2  # 8 idle GPUs: a quarter of their on-demand price
    assert b.rate("H20", 1, "usage") == Decimal("10.625") and b.usage_floor_rate("H20") == Decimal("2.125")
    assert b.host_rate(4000, 0, "usage") == b.host_rate(4000, 0)  # the host part is on demand
    with pytest.raises(ValueError, match="slice"):
        b.rate("H100-SXM", 1, "usage", milli=143)


def test_a_book_stored_before_usage_prices_offers_no_usage_billing() -> None:
    old = {"gpu_hour": {"H20": "8.50"}, "spot_factor": "0.40"}
    b = PriceBook.model_validate(old)
    assert b.usage_gpu_hour == {} and not b.offered("H20", "usage") and b.offered("H20")
    with pytest.raises(KeyError, match="no usage price"):
        b.rate("H20", 1, "usage")
    assert PriceBook.model_validate(b.model_dump(mode="json")) == b


@pytest.mark.parametrize("floor", ["-0.01", "1.01", "NaN", "cheap", True, []])
def test_a_floor_outside_0_to_1_is_refused_naming_it(floor: object) -> None:
    with pytest.raises(ValidationError) as e:
        PriceBook.model_validate({"gpu_hour": {}, "usage_floor": floor})
    assert [err["loc"] for err in e.value.errors()] == [("usage_floor",)]
    with pytest.raises(Invalid, match=r"^price book: usage_floor: "):
        control_prices.validate({"gpu_hour": {}, "usage_floor": floor})


@pytest.mark.parametrize("price", ["-1", "100000.01", "Infinity"])
def test_usage_prices_are_bounded_like_every_price(price: str) -> None:
    with pytest.raises(Invalid, match=r"^price book: usage_gpu_hour"):
        control_prices.validate({"gpu_hour": {"H20": "8.50"}, "usage_gpu_hour": {"H20": price}})


def test_usage_is_offered_beside_on_demand_and_names_are_the_catalogs() -> None:
    dormant = control_prices.validate({"gpu_hour": {"H20": "8.50"}, "usage_gpu_hour": {"h100": "30"}})
    assert dormant.usage_gpu_hour == {"H100-SXM": Decimal(30)} and not dormant.offered("H100-SXM", "usage")
    with pytest.raises(Invalid, match=r"^usage_gpu_hour\.nope: "):
        control_prices.validate({"gpu_hour": {"H20": "8.50"}, "usage_gpu_hour": {"nope": "30"}})
    b = control_prices.validate({"gpu_hour": {"h20": "8.50"}, "usage_gpu_hour": {"h20": "10.123456789"}})
    assert b.usage_gpu_hour == {"H20": Decimal("10.12345679")} and b.offered("H20", "usage")


# ---- the spec -----------------------------------------------------------------------------------------------------
def test_billing_usage_is_a_billing_mode_for_whole_gpus_scheduled_as_on_demand() -> None:
    s = parse_spec({"name": "x", "command": "c", "resources": {"gpus": 8}, "billing": "usage"})
    assert (s.billing_mode(), s.priority_class(), s.plan_id()) == ("usage", "on-demand", None)
    elastic = parse_spec({"name": "x", "command": "c", "resources": {"gpus": {"min": 2, "max": 8}}, "billing": "usage"})
    assert elastic.billing_mode() == "usage"
    for resources, why in (({"gpus": 0}, "CPU-only"), ({"gpu": "H100-SXM", "slice": "1g.10gb"}, "slice")):
        with pytest.raises(SpecError, match=f"billing: usage is billed by whole GPUs.*{why}"):
            parse_spec({"name": "x", "command": "c", "resources": resources, "billing": "usage"})
    with pytest.raises(SpecError, match="must be on-demand, spot, usage or plan"):
        parse_spec({"name": "x", "command": "c", "billing": "usage2"})


def test_the_worked_example_in_docs_billing_md() -> None:
    """2 x H20 and 4 cores by usage on the shipped book, stopped after 100.6 s: the numbers docs/billing.md shows."""
    b = shipped()
    rates = UsageRates(b.rate("H20", 2, "usage"), b.usage_floor_rate("H20", 2), b.host_rate(4000, 0), 2)
    assert (rates.full, rates.floor, rates.host) == (Decimal("21.25"), Decimal("4.25"), Decimal("0.40"))
    gpu0 = [(500 + 5000 * k, permille(90.0)) for k in range(21)]
    gpu1 = [(700 + 5000 * k, permille(30.0)) for k in range(10)]
    windows, billed = windows_due("al_example", 100.6, True, 0, 60)
    assert billed == 101 and [(w.start_s, w.end_s) for w in windows] == [(0, 60), (60, 101)]
    assert (gpu_activity(gpu0, 0, 101, 6), gpu_activity(gpu1, 0, 101, 6)) == (90_900, 68_800)
    first, second = activity([gpu0, gpu1], 0, 60, 6), activity([gpu0, gpu1], 60, 101, 6, until_ms=100_600)
    assert (first, second) == (81_800, 77_900)
    assert window_cost(rates, 0, 60, 0, first) == Decimal("0.27063889")
    assert window_cost(rates, 60, 101, first, second) == Decimal("0.23688889")
    assert usage_cost(rates, 101, 159_700) == Decimal("0.50752778")
    assert (cost_of(Decimal("21.65"), 101), cost_of(Decimal("4.65"), 101)) == (Decimal("0.60740278"),
                                                                              Decimal("0.13045833"))  # fmt: skip
