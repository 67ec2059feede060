"""Metering of allocations billed by usage (`billing: usage`): each window charged from its GPUs' stored readings.

A window is charged once it ended `delay_s` ago (a stopped run is settled `delay_s` after it stopped), so the
readings of its seconds are in: the telemetry loop stores a reading within a sampling period, an agent's batch
within its interval. Readings stored later do not change a posted charge; the seconds they would have spoken for
were charged as fully active (billing/usage.py says why that is the rule). Each window is posted in the same
database transaction that advances `metered_until_s` and the allocation's `activity_permille_s` (the activity integral
of the seconds charged), under the metering lease and row lock of `control/money/metering.py`: a crash leaves all of it
or none, a retry recomputes the same window with the same key, and a key posted already is never posted twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.billing.metering import billable_seconds, cost_of
from suanli.billing.money import ZERO, exact
from suanli.billing.usage import (
    FULL,
    Reading,
    UsageRates,
    activity,
    permille,
    usage_cost,
    visible,
    window_cost,
    windows_due,
)
from suanli.control.money import late_ends, ledger
from suanli.control.settings import Settings
from suanli.db.models import Allocation, Gpu, Node
from suanli.db.telemetry import GpuSampleRow

USAGE = "usage"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
KEEP_AT_MOST_S = 86_400  # raw readings an unsettled usage allocation may keep from compaction, at most


@dataclass(frozen=True)
class UsagePolicy:
    span_s: int = 6  # seconds one reading speaks for: the sampling period plus slack
    delay_s: int = 30  # seconds after a window ends before it is charged: readings still on their way get in


def policy_of(settings: Settings) -> UsagePolicy:
    """The server's: a reading speaks for the sampling interval rounded up plus a second, unless set."""
    span = settings.usage_span_s or math.ceil(settings.telemetry_interval_s) + 1
    return UsagePolicy(span_s=span, delay_s=settings.usage_delay_s)


@dataclass
class UsagePass:
    posted: int = 0
    repeated: int = 0
    amount: Decimal = ZERO
    settled: bool = False
    credited: Decimal = ZERO  # given back for windows charged past the run's end


def epoch_ms(t: datetime) -> int:
    """Milliseconds since the epoch, exactly (samples are keyed by them)."""
    return (t - EPOCH) // timedelta(milliseconds=1)


def rates_of(a: Allocation) -> UsageRates:
    host = exact(a.host_rate_per_hour)
    return UsageRates(exact(a.rate_per_hour - host), exact(a.floor_rate_per_hour or ZERO), host, a.gpus)


def readings(s: Session, a: Allocation, start_s: int, end_s: int, span_s: int) -> list[list[Reading]]:
    """The readings that may speak for the seconds [start_s, end_s) of the allocation, one list per GPU it holds
    (in placement order), as (ms since it started, permille). A GPU in MIG mode reports no utilisation of its own
    (NVML gives none), and an unregistered one none at all: their lists stay empty, so they count as fully active."""
    keys = [(node, int(i)) for node, idx in sorted((a.placement or {}).items()) for i in idx]
    rows = s.execute(
        select(Node.name, Gpu.index, Gpu.id, Gpu.mig_mode)
        .join(Gpu, Gpu.node_id == Node.id)
        .where(Node.name.in_(sorted({node for node, _ in keys})))
    )
    gpu_ids = {(name, index): gid for name, index, gid, mig in rows if not mig}
    by_gpu: dict[int, list[Reading]] = {gid: [] for gid in gpu_ids.values()}
    start_ms = epoch_ms(a.started_at)
    lo = start_ms + start_s * 1000
    hi = start_ms + (end_s + span_s - 1) * 1000  # a reading speaks for the seconds before it
    if a.stopped_at is not None:
        hi = min(hi, epoch_ms(a.stopped_at))
    r = GpuSampleRow
    if by_gpu and hi > lo:
        q = select(r.gpu_id, r.t_ms, r.util, r.error).where(r.gpu_id.in_(list(by_gpu)), r.t_ms >= lo, r.t_ms < hi)
        for gid, t_ms, util, error in s.execute(q):
            by_gpu[gid].append((t_ms - start_ms, permille(util, error)))
    return [by_gpu.get(gpu_ids.get(k, -1), []) for k in keys]


def share(activity_permille_s: int, gpus: int, seconds: int) -> str:
    """Average activity as a percentage with one decimal, for memos."""
    if seconds <= 0 or gpus <= 0:
        return "0.0%"
    pct = Decimal(activity_permille_s) / (Decimal(FULL) * gpus * seconds) * 100
    return f"{pct.quantize(Decimal('0.1'))}%"


def meter_allocation(s: Session, a: Allocation, now: datetime, window_s: int, policy: UsagePolicy) -> UsagePass:
    """Post the windows of a usage allocation that are due, in the caller's transaction (the caller holds the row
    lock and the lease), and settle it once it stopped `delay_s` ago."""
    out = UsagePass()
    stopped = a.stopped_at is not None
    end = a.stopped_at if a.stopped_at is not None else now
    elapsed = max(0.0, (end - a.started_at).total_seconds())
    seen_s, seen_stopped = visible(elapsed, stopped, (now - a.started_at).total_seconds(), policy.delay_s)
    windows, billed = windows_due(a.id, seen_s, seen_stopped, a.metered_until_s, window_s)
    if windows:
        per_gpu = readings(s, a, windows[0].start_s, windows[-1].end_s, policy.span_s)
        until = epoch_ms(a.stopped_at) - epoch_ms(a.started_at) if a.stopped_at is not None else None
        rates = rates_of(a)
        for w in windows:
            act = activity(per_gpu, w.start_s, w.end_s, policy.span_s, until)
            amount = window_cost(rates, w.start_s, w.end_s, a.activity_permille_s, act)
            if amount > ZERO:
                memo = (
                    f"{a.workload or a.id}: {w.start_s}-{w.end_s} s, {share(act, a.gpus, w.end_s - w.start_s)} active"
                )
                tx = transfer(w.key, "usage", org_account(a.org_id), REVENUE, amount, memo)
                _, created = ledger.post(s, tx, now, org_id=a.org_id, user_id=a.user_id, allocation_id=a.id,
                                         allow_negative=[org_account(a.org_id)])  # fmt: skip
                if created:
                    out.posted += 1
                    out.amount += amount
                    a.charged = exact(a.charged + amount)
                else:
                    out.repeated += 1
            a.activity_permille_s += act
            a.metered_until_s = w.end_s
    if seen_stopped:
        out.credited = credit_past_end(s, a, billed, now)
        a.metered_until_s = max(a.metered_until_s, billed)
        a.settled = out.settled = True
    return out


def credit_past_end(s: Session, a: Allocation, billed: int, now: datetime) -> Decimal:
    """Give back what windows charged past a usage run's end cost, its end learned only after they were charged
    (its server was down, the loop waited out a dead leader's lease, the executor reported an earlier end): the run
    then owes U(billed, A) for its `billed` seconds. A is taken as all the activity charged, up to fully active for
    those seconds: the readings of the seconds past the end may be gone (raw readings are kept hours, not for
    ever), and a reading that is missing must never lower a bill, so no more is given back than is owed (exact for
    a run fully active or idle throughout). One `refund` per correction, keyed `usage-credit:<allocation>:<seconds
    billed>` as per-second metering's (`metering.settle_credit`), so an end corrected twice is given back twice."""
    paid = a.metered_until_s
    if paid <= billed:
        return ZERO
    kept = min(a.activity_permille_s, FULL * a.gpus * billed)
    over = exact(a.charged - usage_cost(rates_of(a), billed, kept))
    a.activity_permille_s, a.metered_until_s = kept, billed
    return late_ends.give_back(s, a, billed, paid, over, now) if over > ZERO else ZERO


def settle_now(s: Session, a: Allocation, now: datetime, window_s: int, policy: UsagePolicy = UsagePolicy()) -> Decimal:
    """Charge what is left of a stopped usage allocation at once, from the readings stored so far, and return all
    it was charged: what a fault credit gives back (the tenant is then charged nothing for the lost attempt)."""
    a = s.get(Allocation, a.id, with_for_update=True, populate_existing=True) or a
    if a.stopped_at is not None and not a.settled:
        meter_allocation(s, a, max(now, a.stopped_at), window_s, UsagePolicy(policy.span_s, delay_s=0))
        a.lock_owner, a.lock_expires_at = None, None  # a metering worker that held the row leaves it alone
    return exact(a.charged)


def cost_so_far(a: Allocation, now: datetime) -> Decimal:
    """What `ps` shows for a usage allocation: what is charged, plus the seconds not charged yet at the full
    rate (an upper bound until their readings are in)."""
    end = a.stopped_at or now
    seconds = billable_seconds(max(0.0, (end - a.started_at).total_seconds()), a.stopped_at is not None)
    rest = cost_of(a.rate_per_hour, seconds) - cost_of(a.rate_per_hour, a.metered_until_s)
    return exact(a.charged + max(rest, ZERO))


def oldest_reading_needed_ms(s: Session, now: datetime, span_s: int) -> int | None:
    """The oldest sample time an unsettled usage allocation will still read (compaction keeps raw samples from
    there), but never more than KEEP_AT_MOST_S back: a run that cannot settle must not keep the table growing."""
    rows = s.execute(
        select(Allocation.started_at, Allocation.metered_until_s)
        .where(Allocation.billing_mode == USAGE, Allocation.settled.is_(False))
    ).all()  # fmt: skip
    if not rows:
        return None
    oldest = min(epoch_ms(started) + paid * 1000 for started, paid in rows)  # a reading speaks for seconds before it
    return max(oldest, epoch_ms(now) - KEEP_AT_MOST_S * 1000)
