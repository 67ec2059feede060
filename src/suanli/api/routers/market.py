"""Prices, offers and quotes: what a tenant can rent, at what price, and what a workload would cost."""

from __future__ import annotations

from fastapi import APIRouter, Response

from suanli.api.deps import Auth, in_thread
from suanli.api.schemas import money
from suanli.api.schemas_market import OfferOut, QuoteIn, QuoteOut, WorkloadQuoteIn, WorkloadQuoteOut
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.errors import Invalid
from suanli.control.money import offers, prices, pricing
from suanli.control.workloads import admission
from suanli.perf import MODEL_PRESETS, TrainJob, model_preset

router = APIRouter(route_class=StrictJSONRoute, tags=["market"])


@router.get("/prices")
@in_thread
def get_prices(ctx: Auth, response: Response) -> dict[str, object]:
    """The price book in force (per GPU-hour on demand, spot factor, slice premium, host CPU per core-hour and
    memory per GiB-hour, storage, plans, and usage billing's price per GPU-hour fully active and its floor). Its
    `ETag` is the version, for a whole book sent back with `If-Match` (`PUT /admin/prices`)."""
    with ctx.db.read() as s:
        version, book = prices.current(s)
    response.headers["ETag"] = f'"{version}"'
    return {"version": version, **book.model_dump(mode="json")}


@router.get("/offers")
@in_thread
def get_offers(ctx: Auth) -> list[OfferOut]:
    """Per GPU model: total, free now (less what plans reserve and leave idle), largest free block in one NVLink
    domain and one leaf, GPUs reserved by plans, prices (on demand, spot, plans, slices, usage: fully active and
    idle)."""
    with ctx.db.read() as s:
        snap = offers.snapshot(s, ctx.srv.offers, ctx.now)
    return [
        OfferOut(
            gpu=o.gpu, memory_gb=o.memory_gb, total=o.total, free=o.free, largest_free_nvlink=o.largest_free_nvlink,
            largest_free_leaf=o.largest_free_leaf, nodes=o.nodes, currency=o.currency, reserved=o.reserved,
            on_demand_per_gpu_hour=None if o.on_demand is None else money(o.on_demand),
            spot_per_gpu_hour=None if o.spot is None else money(o.spot),
            plans_per_gpu_hour={k: money(v) for k, v in o.plans.items()},
            slices_per_hour={k: str(v) for k, v in o.slices.items()},
            usage_per_gpu_hour=None if o.usage is None else money(o.usage),
            usage_floor_per_gpu_hour=None if o.usage_floor is None else money(o.usage_floor),
            cpu_per_core_hour=money(o.cpu_core_hour), memory_per_gib_hour=money(o.memory_gib_hour),
        )
        for o in snap.offers
    ]  # fmt: skip


@router.post("/quotes")
@in_thread
def create_quote(body: QuoteIn, ctx: Auth) -> list[QuoteOut]:
    """Predicted step time, total time and cost of a training run on each feasible offer, best first."""
    if body.model not in MODEL_PRESETS:
        raise Invalid(f"model: unknown preset {body.model!r}; presets: {', '.join(MODEL_PRESETS)}")
    job = TrainJob(model_preset(body.model), body.precision, body.seq_len, body.global_batch)
    gpu = None if body.gpu == "any" else body.gpu
    with ctx.db.read() as s:
        rows = offers.quotes(
            s, ctx.srv.offers, job, body.n_tokens, gpu=gpu, gpus=body.gpus, mode=body.billing_mode, rank=body.rank,
            limit=body.limit, host_per_gpu=body.host_per_gpu(), now=ctx.now,
        )  # fmt: skip
    return [QuoteOut.model_validate(r) for r in rows]


@router.post("/quotes/workload")
@in_thread
def quote_workload(body: WorkloadQuoteIn, ctx: Auth) -> list[WorkloadQuoteOut]:
    """What a workload spec would pay on each GPU model that could run it (CPU-only work: one row), cheapest
    first: its hourly rate split into GPUs and host CPU and memory, and the cost of its `duration` (else
    `max_duration`). The same checks as a submission (422 naming the field), nothing is queued."""
    spec = admission.parse(body.spec if body.spec is not None else body.spec_yaml or "")
    with ctx.db.read() as s:
        rows = pricing.quote_workload(
            s, ctx.who, spec, ctx.now, fleet=ctx.srv.fleet, prices=ctx.srv.prices, org_id=body.org
        )
    return [WorkloadQuoteOut.model_validate(r) for r in rows]
