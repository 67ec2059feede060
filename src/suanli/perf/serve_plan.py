"""The cheapest way to serve a request rate under a latency SLO, on each GPU offer. Pure.

For one offer (a GPU model, its cluster layout and its price per GPU-hour), every replica layout worth trying
(GPUs per replica a power of two up to the offer's limit, TP inside an NVLink domain, PP over the rest, EP over
the stage for MoE models) and precision is sized by `replica_capacity`: the highest request rate one replica takes
while its mean time to first token and inter-token latency stay within the SLO. `replicas = ceil(rps / capacity)`;
cost per hour and per million output tokens follow exactly (Decimal). `cheapest_per_offer` returns the cheapest
configuration of each offer; the serving control plane's replica sizing calls `size_replicas` for one offer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from suanli.catalog import GPUSpec
from suanli.perf.inference import ServeEstimate, ServeWorkload, estimate
from suanli.perf.models import TransformerArch
from suanli.perf.serve_shape import (
    SERVE_PRECISIONS,
    Layout,
    ServeError,
    ServePrecision,
    ServeShape,
    check_layout,
    check_precision,
    shape_of,
)
from suanli.perf.training import GroupFn

RATE_STEPS = 16  # bisection steps on the request rate (resolution 1.5e-5 of the saturation rate)
MILLION = Decimal(1_000_000)
SECONDS_PER_HOUR = Decimal(3600)


@dataclass(frozen=True)
class SLO:
    ttft_s: float  # mean time to first token
    itl_s: float  # mean inter-token latency


@dataclass(frozen=True)
class ServeOffer:
    """GPUs of one model that could serve: `group` forms communicators over them (as `Placement.group_fn`)."""

    gpu: GPUSpec
    price_per_gpu_hour: Decimal
    max_gpus_per_replica: int
    domain_size: int  # GPUs per NVLink domain: TP stays inside one
    group: GroupFn


@dataclass(frozen=True)
class ServeConfig:
    gpu: str
    layout: Layout
    precision: ServePrecision
    replica_rps: float  # the most requests/s one replica takes within the SLO
    replicas: int
    estimate: ServeEstimate  # one replica at rps / replicas
    cost_per_hour: Decimal
    cost_per_million_output_tokens: Decimal

    def as_dict(self) -> dict[str, object]:
        lay = self.layout
        return {
            "gpu": self.gpu,
            "gpus_per_replica": lay.gpus,
            "tp": lay.tp,
            "pp": lay.pp,
            "ep": lay.ep,
            "precision": self.precision,
            "replicas": self.replicas,
            "gpus": self.replicas * lay.gpus,
            "replica_max_rps": round(self.replica_rps, 3),
            "ttft_ms": None if self.estimate.ttft_s is None else round(self.estimate.ttft_s * 1e3, 2),
            "itl_ms": round(self.estimate.itl_s * 1e3, 3),
            "output_tokens_per_s": round(self.estimate.tokens_per_s * self.replicas, 1),
            "cost_per_hour": format(self.cost_per_hour, "f"),
            "cost_per_million_output_tokens": format(self.cost_per_million_output_tokens, "f"),
        }


def layouts(s: ServeShape, max_gpus: int, domain: int) -> Iterator[Layout]:
    """Replica layouts worth trying: powers of two; TP inside the NVLink domain; PP for what TP cannot hold;
    MoE: experts replicated over TP (ep 1) or spread over the stage (ep = GPUs per stage)."""
    n = 1
    while n <= max_gpus:
        for pp in (1, 2, 4, 8):
            if n % pp or pp > s.layers:
                continue
            stage = n // pp
            for tp in (1, 2, 4, 8, 16, 32, 64):
                if tp > stage or stage % tp or tp > domain:
                    continue
                for ep in sorted({1, stage} if s.is_moe else {1}):
                    lay = Layout(n, tp, pp, ep)
                    try:
                        check_layout(s, lay)
                    except ServeError:
                        continue
                    yield lay
        n *= 2


def replica_capacity(
    s: ServeShape, gpu: GPUSpec, lay: Layout, precision: ServePrecision, slo: SLO, input_len: int, output_len: int,
    group: GroupFn,
) -> tuple[float, ServeEstimate] | None:  # fmt: skip
    """The highest request rate (and the estimate at it) one replica serves with mean TTFT and ITL within `slo`;
    None when even a trickle misses it or the model does not fit."""

    def at(rate: float) -> ServeEstimate:
        return estimate(s, gpu, lay, precision, ServeWorkload(input_len, output_len, rate=rate), group)

    def ok(e: ServeEstimate) -> bool:
        return not e.saturated and e.ttft_s is not None and e.ttft_s <= slo.ttft_s and e.itl_s <= slo.itl_s

    try:
        peak = estimate(s, gpu, lay, precision, ServeWorkload(input_len, output_len), group)
    except ServeError:
        return None
    hi = peak.requests_per_s  # the saturation rate of the whole replica
    lo = hi * 1e-6
    low = at(lo)
    if not ok(low):
        return None
    best = low
    for _ in range(RATE_STEPS):
        mid = (lo + hi) / 2
        e = at(mid)
        if ok(e):
            lo, best = mid, e
        else:
            hi = mid
    return lo, best


def size_replicas(
    arch: TransformerArch, offer: ServeOffer, slo: SLO, rps: float, input_len: int, output_len: int,
    precisions: Sequence[ServePrecision] = SERVE_PRECISIONS,
) -> list[ServeConfig]:  # fmt: skip
    """Every layout and precision of `offer` that meets `slo` at `rps`, cheapest first (ties: fewer GPUs)."""
    if not (rps > 0 and math.isfinite(rps)):
        raise ServeError("the request rate must be a positive number")
    s = shape_of(arch)
    out: list[ServeConfig] = []
    for precision in precisions:
        try:
            check_precision(offer.gpu, precision)
        except ServeError:
            continue
        for lay in layouts(s, offer.max_gpus_per_replica, offer.domain_size):
            cap = replica_capacity(s, offer.gpu, lay, precision, slo, input_len, output_len, offer.group)
            if cap is None:
                continue
            rate, _ = cap
            replicas = max(1, math.ceil(rps / rate - 1e-9))
            per_replica = estimate(
                s, offer.gpu, lay, precision, ServeWorkload(input_len, output_len, rate=rps / replicas), offer.group
            )
            per_hour = offer.price_per_gpu_hour * lay.gpus * replicas
            tokens_per_hour = Decimal(repr(rps * output_len)) * SECONDS_PER_HOUR
            per_million = (per_hour * MILLION / tokens_per_hour).quantize(Decimal("0.0001"), rounding=ROUND_CEILING)
            out.append(ServeConfig(offer.gpu.name, lay, precision, rate, replicas, per_replica, per_hour, per_million))
    return sorted(out, key=lambda c: (c.cost_per_hour, c.layout.gpus * c.replicas, c.estimate.itl_s))


def cheapest_per_offer(
    arch: TransformerArch, offers: Sequence[ServeOffer], slo: SLO, rps: float, input_len: int, output_len: int,
    precisions: Sequence[ServePrecision] = SERVE_PRECISIONS,
) -> tuple[list[ServeConfig], list[str]]:  # fmt: skip
    """The cheapest configuration on each offer, cheapest offer first, and the offers that cannot meet the SLO."""
    found: list[ServeConfig] = []
    missed: list[str] = []
    for offer in offers:
        configs = size_replicas(arch, offer, slo, rps, input_len, output_len, precisions)
        if configs:
            found.append(configs[0])
        else:
            missed.append(offer.gpu.name)
    return sorted(found, key=lambda c: c.cost_per_million_output_tokens), missed
