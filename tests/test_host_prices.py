"""Host CPU and memory in the pure core: the price book's per core-hour and per GiB-hour prices (bounded, exact,
loaded from books stored before they existed), the spec's host request (CPU-only work: 1 core and 2 GiB unless
it asks), and per-second charges at a rate that includes them."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from suanli.billing.metering import charges_due, cost_of
from suanli.billing.money import exact
from suanli.billing.prices import DEFAULT_CPU_CORE_HOUR, DEFAULT_MEMORY_GIB_HOUR, MAX_PRICE, PriceBook
from suanli.billing.prices import default_price_book as shipped
from suanli.control.errors import Invalid
from suanli.control.money import prices as control_prices
from suanli.workloads import SpecError, parse_spec
from suanli.workloads.host import cores, gib, host_text
from suanli.workloads.resources import CPU_ONLY_CPUS, CPU_ONLY_MEMORY

HOST_FIELDS = ("cpu_core_hour", "memory_gib_hour")


def book(**host: object) -> PriceBook:
    return PriceBook.model_validate({"gpu_hour": {"H20": "8.50"}, "spot_factor": "0.40", **host})


# ---- the price book -------------------------------------------------------------------------------------------
def test_the_shipped_book_prices_host_cpu_and_memory_small_and_agrees_with_the_model_defaults() -> None:
    b = shipped()
    assert (b.cpu_core_hour, b.memory_gib_hour) == (Decimal("0.10"), Decimal("0.025"))
    assert (b.cpu_core_hour, b.memory_gib_hour) == (DEFAULT_CPU_CORE_HOUR, DEFAULT_MEMORY_GIB_HOUR)
    assert b.host_rate(1000, 2048) == Decimal("0.15")  # the default CPU-only job: ¥0.15 an hour
    assert b.host_rate(500, 2048) == Decimal("0.10")  # AutoDL's GPU-less container: ¥0.10 an hour
    assert b.cpu_core_hour < min(b.gpu_hour.values()) / 10  # small beside any GPU


def test_a_book_stored_before_host_prices_loads_with_the_defaults_and_stores_them_as_strings() -> None:
    old = {"currency": "CNY", "gpu_hour": {"H20": "8.50"}, "spot_factor": "0.40", "slice_premium": "1.10",
           "storage_gb_month": "0.30", "plans": {"daily": {"hours": 24, "discount": "0.10"}}}  # fmt: skip
    b = PriceBook.model_validate(old)
    assert (b.cpu_core_hour, b.memory_gib_hour) == (Decimal("0.10"), Decimal("0.025"))
    doc = b.model_dump(mode="json")
    assert (doc["cpu_core_hour"], doc["memory_gib_hour"]) == ("0.10000000", "0.02500000")
    assert PriceBook.model_validate(doc) == b  # and the new form reads back


@pytest.mark.parametrize("field", HOST_FIELDS)
@pytest.mark.parametrize("value", ["-0.01", -1, "100000.01", "1e30", "NaN", "Infinity", "cheap", "", [], True, None])
def test_host_prices_out_of_bounds_or_not_numbers_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as e:
        book(**{field: value})
    assert [err["loc"] for err in e.value.errors()] == [(field,)]
    with pytest.raises(Invalid, match=f"^price book: {field}: "):  # as the API and `prices load` say it
        control_prices.validate({"gpu_hour": {}, field: value})


@pytest.mark.parametrize("field", HOST_FIELDS)
def test_host_prices_are_exact_to_the_ledgers_precision_and_zero_and_the_maximum_are_allowed(field: str) -> None:
    assert getattr(book(**{field: "0.123456789"}), field) == Decimal("0.12345679")  # rounded once, half-even
    assert getattr(book(**{field: "0"}), field) == 0
    assert getattr(book(**{field: str(MAX_PRICE)}), field) == MAX_PRICE
    assert isinstance(getattr(book(**{field: "0.07"}), field), Decimal)


# ---- the host rate ------------------------------------------------------------------------------------------------
def test_host_rate_is_cores_times_the_core_price_plus_gib_times_the_gib_price_exactly() -> None:
    b = book(cpu_core_hour="0.07", memory_gib_hour="0.013")
    assert b.host_rate(3000, 1536) == Decimal("0.2295")  # 3 x 0.07 + 1.5 x 0.013
    assert b.host_rate(1, 1) == Decimal("0.00008270")  # 0.00007 + 0.013/1024 = 0.0000826953125, rounded once
    assert b.host_rate(0, 0) == 0
    assert b.host_rate(3000, 1536, "spot") == Decimal("0.0918")  # the spot factor applies to the host part too
    with pytest.raises(ValueError):
        b.host_rate(-1, 0)


@given(
    milli=st.integers(0, 4096 * 1000),
    mib=st.integers(0, 1 << 30),
    cpu=st.decimals(0, 1000, places=8),
    mem=st.decimals(0, 1000, places=8),
    spot=st.booleans(),
)
def test_host_rate_equals_the_exact_rational_rounded_once(
    milli: int, mib: int, cpu: Decimal, mem: Decimal, spot: bool
) -> None:
    b = book(cpu_core_hour=str(cpu), memory_gib_hour=str(mem))
    rational = Fraction(milli, 1000) * Fraction(cpu) + Fraction(mib, 1024) * Fraction(mem)
    if spot:
        rational *= Fraction(b.spot_factor)
    # the denominator is a product of 2s and 5s: the rational is a finite decimal, converted without loss
    as_decimal = Decimal(rational.numerator) / Decimal(rational.denominator)
    assert as_decimal * rational.denominator == rational.numerator
    assert b.host_rate(milli, mib, "spot" if spot else "on-demand") == exact(as_decimal)


def test_a_cpu_only_runs_charges_add_up_to_its_cores_and_gib_priced_per_second() -> None:
    """A 4-core, 6 GiB job stopped after 3,661.6 s is billed 3,662 seconds (to the nearest) at 4 x 0.10 + 6 x 0.025
    an hour, however the metering windows split the run."""
    rate = shipped().host_rate(4000, 6144)
    assert rate == Decimal("0.55")
    expected = (Decimal("0.55") * 3662 / 3600).quantize(Decimal("0.00000001"))
    for window in (1, 7, 60, 3600):
        charges = charges_due("al_cpu", rate, 3661.6, True, window_s=window)
        assert sum((c.amount for c in charges), Decimal(0)) == expected == cost_of(rate, 3662)
        assert all(isinstance(c.amount, Decimal) and c.amount > 0 for c in charges)


# ---- the spec's host request -----------------------------------------------------------------------------------
def spec(**resources: object) -> dict[str, object]:
    return {"name": "x", "command": "c", "resources": resources}


def test_cpu_only_work_gets_one_core_and_2_gib_written_into_its_spec_unless_it_asks() -> None:
    s = parse_spec(spec(gpus=0))
    assert (CPU_ONLY_CPUS, CPU_ONLY_MEMORY) == (1, "2Gi")
    assert s.host_request() == (1000, 2048) == s.host_request(0) == s.host_held([0])
    stored = s.model_dump(mode="json", exclude_none=True)  # what the server stores and `describe` shows
    assert (stored["resources"]["cpus"], stored["resources"]["memory"]) == (1.0, "2Gi")
    assert parse_spec(stored) == s
    assert parse_spec(spec(gpus=0, cpus=6)).host_request() == (6000, 2048)
    assert parse_spec(spec(gpus=0, cpus=0.5, memory="3Gi")).host_request() == (500, 3072)
    assert parse_spec("name: x\ncommand: c\nresources: {gpus: 0, memory: 1.5Gi}\n").host_request() == (1000, 1536)


def test_gpu_work_gets_what_it_asks_per_gpu_and_nothing_when_it_asks_nothing() -> None:
    assert parse_spec(spec(gpus=8)).host_request() == (0, 0)  # not counted, not charged, not capped
    s = parse_spec(spec(gpus=8, cpus=10, memory="100Gi"))
    assert s.host_request() == (10_000, 102_400)
    assert s.host_request(3) == (3750, 38_400)  # a node-rank holding 3 of its 8 GPUs
    assert s.host_held([3, 5]) == (10_000, 102_400)
    elastic = parse_spec(spec(gpus={"min": 2, "max": 8}, cpus=3))
    assert elastic.host_request() == (3000, 0) and elastic.host_held([4, 4]) == (12_000, 0)  # grown: 1.5 a GPU
    assert parse_spec(spec(gpus=3, cpus=1)).host_held([1, 1, 1]) == (1002, 0)  # each rank's share rounded up


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"cpus": 0}, "resources.cpus"), ({"cpus": -1}, "resources.cpus"), ({"cpus": 4097}, "resources.cpus"),
        ({"cpus": 1e300}, "resources.cpus"), ({"cpus": float("nan")}, "resources.cpus"), ({"cpus": "4"}, "resources.cpus"),
        ({"cpus": True}, "resources.cpus"), ({"cpus": 0.0001}, "resources.cpus"), ({"memory": "0Mi"}, "resources.memory"),
        ({"memory": "2Pi"}, "resources.memory"), ({"memory": "lots"}, "resources.memory"), ({"memory": 2}, "resources.memory"),
        ({"memory": "9" * 400 + "Gi"}, "resources.memory"),
    ],
)  # fmt: skip
def test_hostile_host_requests_on_cpu_only_work_are_refused_naming_the_field(
    resources: dict[str, object], field: str
) -> None:
    with pytest.raises(SpecError, match=f"^{field}: "):
        parse_spec(spec(gpus=0, **resources))


def test_host_amounts_read_exactly() -> None:
    assert (cores(1500), cores(2000), cores(1), gib(1536), gib(2048), gib(1)) == (
        "1.5", "2", "0.001", "1.5", "2", "0.0009765625")  # fmt: skip
    assert (host_text(1000, 2048), host_text(2500, 0), host_text(0, 0)) == ("1 core, 2 GiB", "2.5 cores, 0 GiB", "-")
