"""Pay by compute used (`billing: usage`): what an allocation's GPUs cost from their measured activity. Pure.

Activity. A GPU reading's utilisation (NVML's `utilization.gpu`: the share of time a kernel ran, in %) becomes a whole
number of permille, `util x 10` rounded half up and clamped to 0..1000 (`permille`); a reading that could not be
taken (its `error` set) or is not a finite number is no reading. Every reading speaks for `span_s` seconds: the
second of the allocation it was taken in and the `span_s - 1` before it (the interval it averages). A second of one GPU is worth the lowest
permille among the readings that speak for it, or 1000 (fully active) when none does. So a reading that goes
missing can only raise a bill, never lower it: the tenant runs code on the GPU and may be able to make readings
fail or vanish, but cannot make one appear (`tests/test_usage_billing.py` checks that deleting any readings never
lowers the activity). The activity integral `A` of a span of seconds is the sum of that value over its seconds and
the allocation's GPUs (permille-GPU-seconds).

Price. An allocation of `n` GPUs keeps three hourly rates fixed when it was admitted: `full` (its GPUs fully
active), `floor` (its GPUs idle: the price book's `usage_floor` share of `full`) and `host` (its CPU cores and
memory, charged by time as in every billing mode). The cost of its first `S` seconds is

    U(S, A) = (host + floor) x S / 3600 + (full - floor) x A / (1000 x n x 3600)

rounded once, half to even, to 1e-8. Fully active (`A = 1000 n S`) it is `cost_of(host + full, S)`, idle (`A = 0`)
`cost_of(host + floor, S)`, and in between it rises with `A`. Window `k` of a run is charged
`U(end_k, A_end) - U(start_k, A_start)`, so the windows add up to exactly `U(S, A)` however the run was split, as in
per-second metering; the seconds `S` are the time rule's (`billing.metering.billable_seconds`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from suanli.billing.metering import billable_seconds
from suanli.billing.money import INTERNAL, ZERO

FULL = 1000  # permille: a fully active GPU-second
UNITS = int(1 / INTERNAL)  # 1e-8 units to the currency unit
Reading = tuple[int, int | None]  # (ms since the allocation started, permille; None: no reading)


def permille(util: float, error: str = "") -> int | None:
    """A reading's activity in permille (util in %, rounded half up), or None when it is no reading."""
    if error or not isinstance(util, int | float) or not math.isfinite(util):
        return None
    value = (Decimal(util) * 10).to_integral_value(rounding=ROUND_HALF_UP)  # Decimal(float) is the float exactly
    return int(min(max(value, 0), FULL))


def gpu_activity(
    readings: Iterable[Reading], start_s: int, end_s: int, span_s: int, until_ms: int | None = None
) -> int:
    """Permille-seconds of one GPU over the seconds [start_s, end_s) of an allocation, from its readings (in any
    order); readings before the allocation started, or at or after `until_ms` (when it stopped), do not count."""
    if span_s < 1:
        raise ValueError("span_s must be >= 1")
    if end_s <= start_s:
        return 0
    seconds = [FULL] * (end_s - start_s)
    for at_ms, value in readings:
        if value is None or at_ms < 0 or (until_ms is not None and at_ms >= until_ms):
            continue
        last = at_ms // 1000
        for j in range(max(last - span_s + 1, start_s), min(last + 1, end_s)):
            if value < seconds[j - start_s]:
                seconds[j - start_s] = value
    return sum(seconds)


def activity(
    per_gpu: Sequence[Iterable[Reading]], start_s: int, end_s: int, span_s: int, until_ms: int | None = None
) -> int:
    """The activity integral over the allocation's GPUs (one readings list each; an empty one: no readings, so
    fully active) and the seconds [start_s, end_s)."""
    return sum(gpu_activity(r, start_s, end_s, span_s, until_ms) for r in per_gpu)


@dataclass(frozen=True)
class UsageRates:
    """An allocation's hourly rates in `billing: usage`, fixed when it was admitted."""

    full: Decimal  # its GPUs fully active
    floor: Decimal  # its GPUs idle
    host: Decimal  # its host CPU and memory
    gpus: int

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("usage billing needs at least one GPU")
        if not ZERO <= self.floor <= self.full or self.host < ZERO:
            raise ValueError(f"rates must satisfy 0 <= floor <= full and host >= 0 (got {self})")


def usage_cost(rates: UsageRates, seconds: int, activity_permille_s: int) -> Decimal:
    """U(S, A): the cost of the first `seconds` seconds with activity integral `activity_permille_s`, rounded once
    (half to even) to 1e-8."""
    if seconds < 0 or not 0 <= activity_permille_s <= FULL * rates.gpus * seconds:
        raise ValueError(f"need seconds >= 0 and 0 <= activity <= {FULL} x gpus x seconds")
    value = Fraction(rates.host + rates.floor) * seconds
    value += Fraction(rates.full - rates.floor) * activity_permille_s / (FULL * rates.gpus)
    return Decimal(round(value * UNITS / 3600)).scaleb(-8)  # round(Fraction): exact, half to even


def window_cost(rates: UsageRates, start_s: int, end_s: int, activity_before: int, activity_in: int) -> Decimal:
    """What the seconds [start_s, end_s) cost, given the activity integral of the seconds before them and of
    them: U(end, before + in) - U(start, before). Never negative; the windows of a run add up to U of all of it."""
    return usage_cost(rates, end_s, activity_before + activity_in) - usage_cost(rates, start_s, activity_before)


# ---- which windows are due --------------------------------------------------------------------------------------
def visible(elapsed_s: float, stopped: bool, age_s: float, delay_s: float) -> tuple[float, bool]:
    """The run as metering may charge it now: as it stood `delay_s` ago (readings of later seconds may still be on
    their way), and stopped once `delay_s` have passed since it stopped. `elapsed_s`: its length so far (to its stop
    once stopped); `age_s`: the time since it started."""
    if delay_s < 0:
        raise ValueError("delay_s must be >= 0")
    settled_by = age_s - delay_s
    if stopped and settled_by >= elapsed_s:
        return elapsed_s, True
    return max(0.0, min(elapsed_s, settled_by)), False


@dataclass(frozen=True)
class UsageWindow:
    key: str  # the ledger's idempotency key: the same as per-second metering's, `usage:<allocation>:<window_s>:<k>`
    window: int
    start_s: int  # seconds since the allocation started, inclusive
    end_s: int  # exclusive


def windows_due(
    allocation_id: str, elapsed_s: float, stopped: bool, paid_s: int, window_s: int
) -> tuple[list[UsageWindow], int]:
    """The windows after the first `paid_s` seconds (charged already) that are complete, or all of them once
    stopped, and the seconds they bill to. The first may start inside its window (the window size changed)."""
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    billed = billable_seconds(elapsed_s, stopped)
    last = math.ceil(billed / window_s) if stopped else billed // window_s
    out = []
    for k in range(paid_s // window_s, last):
        start, end = max(k * window_s, paid_s), min((k + 1) * window_s, billed)
        if end > start:
            out.append(UsageWindow(f"usage:{allocation_id}:{window_s}:{k}", k, start, end))
    return out, billed
