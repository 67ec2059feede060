"""Per-second metering that charges every second exactly once, whatever crashes and retries happen.

Rounding rule: a run is billed for its elapsed time rounded to the nearest whole second (half a second up), and
for at least one second if it held its resources at all: 7.01 s is billed 7 s, 7.5 s 8 s, 0.2 s 1 s, 0 s nothing.
It is charged at the allocation's hourly rate. The cost of the first `s` seconds is `C(s) = rate * s / 3600`,
rounded once to the internal precision (1e-8). Charges are posted per fixed window of `window_s` seconds counted from
the allocation's start, window `k` costing `C(end_k) - C(start_k)`. Because those differences telescope,
the total for a run is `C(billed seconds)` however it was split into windows: no drift.

While a run is live only whole windows of its completed seconds are charged (never more than its final bill,
since rounding at the end never goes below the completed seconds); its last (partial) window is charged once,
when it stops. A window's idempotency key is `usage:<allocation>:<window_s>:<k>`, so a metering loop that crashes after
posting and retries computes the same keys and the ledger ignores the repeats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from suanli.billing.money import INTERNAL, ZERO

DEFAULT_WINDOW_S = 60
_EPS = 1e-9  # float rounding: 59.9999999999 elapsed seconds are 60 completed seconds; times are exact to 1 µs
MIN_BILLED_S = 1  # a run that held its resources for any time at all pays at least this


@dataclass(frozen=True)
class Charge:
    key: str
    allocation_id: str
    window: int
    start_s: int  # seconds since the allocation started, inclusive
    end_s: int  # exclusive
    amount: Decimal


def cost_of(rate_per_hour: Decimal, seconds: int) -> Decimal:
    """C(s): the cost of the first s seconds, rounded once."""
    return (rate_per_hour * seconds / 3600).quantize(INTERNAL, rounding=ROUND_HALF_EVEN)


def billable_seconds(elapsed_s: float, stopped: bool) -> int:
    """Whole seconds to bill so far: once stopped, the elapsed time rounded to the nearest second (half up), at
    least `MIN_BILLED_S` when it is not zero; while running, the completed seconds."""
    if elapsed_s < 0:
        raise ValueError("elapsed time cannot be negative")
    if not stopped:
        return math.floor(elapsed_s + _EPS)
    if elapsed_s == 0:
        return 0
    return max(MIN_BILLED_S, math.floor(elapsed_s + 0.5 + _EPS))


def charges_due(
    allocation_id: str,
    rate_per_hour: Decimal,
    elapsed_s: float,
    stopped: bool,
    charged_windows: set[int] | frozenset[int] = frozenset(),
    window_s: int = DEFAULT_WINDOW_S,
) -> list[Charge]:
    """The windows of this allocation that are due and not yet charged, in order."""
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    if rate_per_hour < ZERO:
        raise ValueError("rate cannot be negative")
    billed = billable_seconds(elapsed_s, stopped)
    last = billed // window_s if not stopped else math.ceil(billed / window_s)
    out = []
    for k in range(last):
        if k in charged_windows:
            continue
        start, end = k * window_s, min((k + 1) * window_s, billed)
        if end <= start:
            continue
        amount = cost_of(rate_per_hour, end) - cost_of(rate_per_hour, start)
        if amount == ZERO:
            continue  # free GPUs (a zero rate) post nothing
        out.append(Charge(f"usage:{allocation_id}:{window_s}:{k}", allocation_id, k, start, end, amount))
    return out
