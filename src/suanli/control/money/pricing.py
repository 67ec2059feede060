"""What a workload spec would cost before it is submitted: its hourly rate on each GPU model that could run it
(or, for CPU-only work, on a CPU node), split into GPUs and host CPU and memory, and its cost over the spec's
duration. The same candidates and prices as admission (`admission.candidates`), so the quote is what it pays."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from suanli.billing.metering import billable_seconds, cost_of
from suanli.billing.money import exact
from suanli.control.accounts import accounts
from suanli.control.accounts.accounts import Principal
from suanli.control.caches import FleetCache, PriceCache
from suanli.control.scheduling import inventory
from suanli.control.workloads import admission
from suanli.workloads.spec import WorkloadSpec


def fixed(amount: Decimal) -> str:
    """Exact, fixed-point: "0.15000000", never "1.5E-7"."""
    return format(exact(amount), "f")


def quote_workload(
    s: Session,
    who: Principal,
    spec: WorkloadSpec,
    now: datetime,
    *,
    fleet: FleetCache,
    prices: PriceCache,
    org_id: str | None = None,
) -> list[dict[str, Any]]:
    """One row per GPU model that could run it, cheapest first (one row for CPU-only work). Billed by usage, the rate
    and cost are with its GPUs fully active, `floor_*` with them idle: what it pays lies between."""
    org = who.personal_org_id if org_id in (None, who.personal_org_id) else accounts.org_for(s, who, org_id).id
    _, book = prices.current(s)
    found = admission.candidates(s, spec, org, now, fleet.models_at(s, inventory.fleet_version(s)), book)
    cpu, mem = spec.host_request()
    duration = spec.duration if spec.duration is not None else spec.max_duration
    rows = []
    for c in sorted(found, key=lambda c: c.rate_per_hour):
        cost = cost_of(c.rate_per_hour, billable_seconds(duration, True)) if duration is not None else None
        floor = floor_cost = None
        if spec.billing_mode() == "usage":  # from its GPUs idle throughout to fully active (billing/usage.py)
            floor = exact(book.usage_floor_rate(c.gpu_model, spec.gpu_count()) + c.host_rate_per_hour)
            floor_cost = cost_of(floor, billable_seconds(duration, True)) if duration is not None else None
        rows.append(
            {
                "gpu": c.gpu_model or None, "gpus": spec.gpu_count(), "cpu_milli": cpu, "memory_mib": mem,
                "billing_mode": spec.billing, "gpu_rate_per_hour": fixed(c.rate_per_hour - c.host_rate_per_hour),
                "host_rate_per_hour": fixed(c.host_rate_per_hour), "rate_per_hour": fixed(c.rate_per_hour),
                "duration_s": duration, "cost": fixed(cost) if cost is not None else None, "currency": book.currency,
                "floor_rate_per_hour": fixed(floor) if floor is not None else None,
                "floor_cost": fixed(floor_cost) if floor_cost is not None else None,
            }
        )  # fmt: skip
    return rows
