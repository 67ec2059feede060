"""Prices, offers and quotes: what a tenant can rent, at what price, and what a workload would cost."""

from __future__ import annotations

from fastapi import APIRouter

from suanli.api.deps import Auth, in_thread
from suanli.api.schemas import OfferOut, QuoteIn, QuoteOut, money
from suanli.control import offers, prices
from suanli.control.errors import Invalid
from suanli.perf import MODEL_PRESETS, TrainJob, model_preset

router = APIRouter(tags=["market"])


@router.get("/prices")
@in_thread
def get_prices(ctx: Auth) -> dict[str, object]:
    """The price book in force (per GPU-hour on demand, spot factor, slice premium, storage, plans)."""
    with ctx.db.read() as s:
        version, book = prices.current(s)
    return {"version": version, **book.model_dump(mode="json")}


@router.get("/offers")
@in_thread
def get_offers(ctx: Auth) -> list[OfferOut]:
    """Per GPU model: total, free now, largest free block in one NVLink domain and one leaf, prices."""
    with ctx.db.read() as s:
        snap = offers.snapshot(s, ctx.srv.offers)
    return [
        OfferOut(
            gpu=o.gpu, memory_gb=o.memory_gb, total=o.total, free=o.free, largest_free_nvlink=o.largest_free_nvlink,
            largest_free_leaf=o.largest_free_leaf, nodes=o.nodes, currency=o.currency,
            on_demand_per_gpu_hour=None if o.on_demand is None else money(o.on_demand),
            spot_per_gpu_hour=None if o.spot is None else money(o.spot),
            plans_per_gpu_hour={k: money(v) for k, v in o.plans.items()},
            slices_per_hour={k: str(v) for k, v in o.slices.items()},
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
            limit=body.limit,
        )  # fmt: skip
    return [QuoteOut.model_validate(r) for r in rows]
