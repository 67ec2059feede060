"""What serving a model at a request rate would take and cost on each offer (`suanli quote --serve`): replicas and
GPUs from the performance model's inference estimates (`perf.serve_plan.size_replicas`: the cheapest layout and
precision whose replicas keep the latency SLO), priced exactly (Decimal) from the price book in force.

Prices: a replica costs `book.rate(gpu, gpus_per_replica, mode) + book.host_rate(cpu, memory, mode)` per hour, as
its workload is billed; the endpoint `replicas` times that. Per 1M tokens = hourly cost x 10^6 / tokens per hour
at `rps` (`rps x (input_len + output_len) x 3600`; output tokens only for the output column), rounded up to
10^-8 (a quote never understates)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from sqlalchemy.orm import Session

from suanli import catalog
from suanli.billing.prices import BillingMode
from suanli.control.errors import Invalid
from suanli.control.money.offers import OfferCache, _topology, snapshot
from suanli.perf import model_preset
from suanli.perf.plan import Placement
from suanli.perf.serve_plan import SLO, ServeOffer, size_replicas
from suanli.perf.serve_shape import ServeError, ServePrecision

MILLION = Decimal(1_000_000)
HOUR_S = Decimal(3600)
STEP = Decimal("0.00000001")


@dataclass(frozen=True)
class ServeAsk:
    """What to serve (all bounded by the API's schema)."""

    model: str  # a performance-model preset
    rps: Decimal
    input_len: int
    output_len: int
    slo_ttft_ms: Decimal
    slo_itl_ms: Decimal
    gpu: str | None = None
    precisions: tuple[ServePrecision, ...] = ("bf16", "fp16", "fp8", "fp4")
    max_gpus_per_replica: int = 8
    mode: BillingMode = "on-demand"
    cpu_milli: int = 0  # host CPU and memory per replica, priced like any workload's
    memory_mib: int = 0


def serve_quotes(s: Session, cache: OfferCache, ask: ServeAsk) -> dict[str, Any]:
    """The cheapest configuration on each registered (cluster, GPU model) priced for `ask.mode`, cheapest per 1M
    tokens first; and the offers where no replica layout keeps the SLO."""
    try:
        arch = model_preset(ask.model)
    except (KeyError, ValueError) as e:
        raise Invalid(f"model: {e}") from None
    want = None
    if ask.gpu is not None:
        try:
            want = catalog.gpu(ask.gpu).name
        except catalog.CatalogError as e:
            raise Invalid(f"gpu: {e}") from None
    snap = snapshot(s, cache)
    book = snap.book
    key = ("serve", ask, snap.book.currency)
    with cache.lock:
        if key in cache.quotes:
            return cache.quotes[key][0]
    slo = SLO(float(ask.slo_ttft_ms) / 1e3, float(ask.slo_itl_ms) / 1e3)
    tokens_h = ask.rps * (ask.input_len + ask.output_len) * HOUR_S
    out_tokens_h = ask.rps * ask.output_len * HOUR_S
    rows: list[dict[str, Any]] = []
    missed: list[str] = []
    with cache.compute:
        for (cid, model), free in sorted(snap.free_by_cluster_model.items()):
            if (want and model != want) or not book.offered(model, ask.mode) or ask.mode == "usage":
                continue
            topo = _topology(cache, snap.clusters[cid], model)
            if topo is None:
                continue
            n = min(ask.max_gpus_per_replica, topo.n_gpus)
            placement = Placement(topo, topo.compact_gpus(n))
            offer = ServeOffer(catalog.gpu(model), book.gpu_rate(model, ask.mode), n, placement.domain_size,
                               placement.group_fn())  # fmt: skip
            try:
                configs = size_replicas(arch, offer, slo, float(ask.rps), ask.input_len, ask.output_len,
                                        ask.precisions)  # fmt: skip
            except ServeError as e:
                raise Invalid(f"model: {e}") from None
            name = snap.clusters[cid].name
            if not configs:
                missed.append(f"{model} ({name})")
                continue
            c = configs[0]
            replica_h = book.rate(model, c.layout.gpus, ask.mode) + book.host_rate(ask.cpu_milli, ask.memory_mib,
                                                                                     ask.mode)  # fmt: skip
            per_hour = replica_h * c.replicas
            gpus = c.layout.gpus * c.replicas
            rows.append({
                "cluster": name, "gpu": model, "gpus_per_replica": c.layout.gpus, "tp": c.layout.tp,
                "pp": c.layout.pp, "ep": c.layout.ep, "precision": c.precision, "replicas": c.replicas,
                "gpus": gpus, "free_gpus": free, "available_now": free >= gpus,
                "replica_max_rps": round(c.replica_rps, 3),
                "ttft_ms": None if c.estimate.ttft_s is None else round(c.estimate.ttft_s * 1e3, 2),
                "itl_ms": round(c.estimate.itl_s * 1e3, 3),
                "rate_per_hour": str(per_hour), "replica_per_hour": str(replica_h),
                "per_1m_tokens": str(_per_million(per_hour, tokens_h)),
                "per_1m_output_tokens": str(_per_million(per_hour, out_tokens_h)),
            })  # fmt: skip
    rows.sort(key=lambda r: (Decimal(r["per_1m_tokens"]), r["gpus"], r["cluster"]))
    doc = {"model": arch.name, "rps": str(ask.rps), "input_len": ask.input_len, "output_len": ask.output_len,
           "slo_ttft_ms": str(ask.slo_ttft_ms), "slo_itl_ms": str(ask.slo_itl_ms), "billing_mode": ask.mode,
           "currency": book.currency, "offers": rows, "cannot_meet_slo": missed}  # fmt: skip
    with cache.lock:
        cache.quotes[key] = [doc]
        while len(cache.quotes) > 256:
            cache.quotes.popitem(last=False)
    return doc


def _per_million(per_hour: Decimal, tokens_per_hour: Decimal) -> Decimal:
    return (per_hour * MILLION / tokens_per_hour).quantize(STEP, rounding=ROUND_CEILING)
