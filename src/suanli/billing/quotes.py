"""Time-and-cost quotes: for a training workload, what each offer would take and cost, ranked.

Pure: the caller passes the clusters (one per GPU model on offer, as the inventory describes them), how
many GPUs of each are free, and the price book. For every GPU count worth trying, the performance model
finds the fastest plan that fits on the most compact set of those GPUs; the quote is its step time, the
time to train the requested tokens, and the cost at the offer's hourly rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from suanli.billing.money import exact
from suanli.billing.prices import BillingMode, PriceBook
from suanli.perf import Placement, PlanError, TrainJob, search
from suanli.topology.model import Cluster

Rank = Literal["cheapest", "fastest"]


@dataclass(frozen=True)
class Offer:
    cluster: Cluster  # the GPUs of one model, as placed in the fabric
    free_gpus: int

    @property
    def gpu(self) -> str:
        return self.cluster.groups[0].gpu.name


@dataclass(frozen=True)
class Quote:
    gpu: str
    gpus: int
    plan: dict[str, object]
    step_time_s: float
    tokens_per_s: float
    mfu: float
    total_time_s: float
    rate_per_hour: Decimal
    cost: Decimal
    available_now: bool
    host_rate_per_hour: Decimal = Decimal(0)  # the host CPU and memory part of rate_per_hour
    # billing: usage: rate_per_hour and cost are with the GPUs fully active; these with them idle (the floor)
    floor_rate_per_hour: Decimal | None = None
    floor_cost: Decimal | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "plan": self.plan,
            "step_time_s": round(self.step_time_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "mfu": round(self.mfu, 4),
            "total_time_s": round(self.total_time_s, 1),
            "rate_per_hour": format(self.rate_per_hour, "f"),
            "cost": format(self.cost.quantize(Decimal("0.01")), "f"),
            "available_now": self.available_now,
            "host_rate_per_hour": format(self.host_rate_per_hour, "f"),
            "floor_rate_per_hour": None if self.floor_rate_per_hour is None else format(self.floor_rate_per_hour, "f"),
            "floor_cost": None if self.floor_cost is None else format(self.floor_cost.quantize(Decimal("0.01")), "f"),
        }


def gpu_counts(n_gpus: int, gpus_per_node: int) -> list[int]:
    """Counts worth quoting: powers of two inside a node, then whole nodes doubling, up to the offer's size."""
    counts = []
    k = 1
    while k <= min(gpus_per_node, n_gpus):
        counts.append(k)
        k *= 2
    k = 2 * gpus_per_node
    while k <= n_gpus:
        counts.append(k)
        k *= 2
    return counts


def quote(
    job: TrainJob,
    tokens: float,
    offers: Sequence[Offer],
    prices: PriceBook,
    *,
    gpus: int | None = None,
    mode: BillingMode = "on-demand",
    rank: Rank = "cheapest",
    limit: int = 10,
    host: tuple[int, int] = (0, 0),
) -> list[Quote]:
    """Feasible quotes, best first. `gpus` fixes the count; otherwise a range of counts is tried. `host`: the
    host CPU (milli-cores) and memory (MiB) each GPU asks for, priced with the GPUs. Billed by usage, a quote is
    the range from its GPUs idle throughout (`floor_*`) to fully active (rate and cost), and ranks by the latter."""
    if tokens <= 0:
        raise ValueError("tokens must be positive")
    out: list[Quote] = []
    for offer in offers:
        c = offer.cluster
        gpn = c.groups[0].gpus_per_node
        counts = [gpus] if gpus else gpu_counts(c.n_gpus, gpn)
        for n in counts:
            if n > c.n_gpus or job.global_batch < 1:
                continue
            try:
                best = search(job, Placement(c, c.compact_gpus(n)), top=1)[0]
            except PlanError:
                continue
            if not best.fits:
                continue
            seconds = tokens / best.tokens_per_s
            host_rate = prices.host_rate(host[0] * n, host[1] * n, mode)
            rate = exact(prices.rate(offer.gpu, n, mode) + host_rate)
            cost = exact(rate * Decimal(str(seconds)) / 3600)
            floor = exact(prices.usage_floor_rate(offer.gpu, n) + host_rate) if mode == "usage" else None
            floor_cost = exact(floor * Decimal(str(seconds)) / 3600) if floor is not None else None
            plan = {k: getattr(best.plan, k) for k in ("tp", "pp", "cp", "dp", "vp", "mbs", "zero", "recompute")}
            out.append(
                Quote(
                    offer.gpu,
                    n,
                    plan,
                    best.step_time_s,
                    best.tokens_per_s,
                    best.mfu,
                    seconds,
                    rate,
                    cost,
                    n <= offer.free_gpus,
                    host_rate,
                    floor,
                    floor_cost,
                )
            )
    key = (lambda q: (q.cost, q.total_time_s)) if rank == "cheapest" else (lambda q: (q.total_time_s, q.cost))
    return sorted(out, key=key)[:limit]
