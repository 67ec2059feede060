"""What is on offer (per GPU model: how many, how many free now, the largest free block inside one NVLink
domain and one leaf, how many reserved by plans, prices by billing mode, and the host CPU and memory prices) and
what a training run would take and cost on each offer.

Both are computed from one snapshot of the inventory, open allocations and active plans, cached per (inventory
version, price-book version, plans version) until the first active plan ends: with thousands of nodes a request
reads three small rows, not the whole inventory. GPUs that plans reserve and their work does not use are taken:
`free` (and the free blocks) leave them out.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from threading import Lock
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli import catalog
from suanli.billing.money import exact
from suanli.billing.prices import BillingMode, PriceBook
from suanli.billing.quotes import Offer as QuoteOffer
from suanli.billing.quotes import Quote, Rank, quote
from suanli.control.errors import Invalid
from suanli.control.ids import utcnow
from suanli.control.money import plans as plans_module
from suanli.control.money import prices
from suanli.control.scheduling import inventory
from suanli.db.models import Allocation, ClusterRow, KeyValue, Node, PriceBookVersion
from suanli.perf import TrainJob
from suanli.perf.training import precision_gap
from suanli.sched.types import mig_milli
from suanli.topology import Cluster


@dataclass(frozen=True)
class GpuOffer:
    gpu: str
    memory_gb: float
    total: int  # GPUs on nodes that are not down
    free: int  # GPUs on ready nodes held by no allocation, less those plans reserve and their work leaves idle
    largest_free_nvlink: int
    largest_free_leaf: int
    nodes: int
    currency: str
    on_demand: Decimal | None  # per GPU-hour; None: the operator set no price, so it cannot be rented
    spot: Decimal | None
    plans: dict[str, Decimal]  # effective per GPU-hour price of each reserved plan
    slices: dict[str, Decimal]  # per hour of one MIG slice, by profile (MIG-capable GPUs)
    usage: Decimal | None  # billing: usage, per GPU-hour fully active; None: not offered by usage
    usage_floor: Decimal | None  # billing: usage, per GPU-hour idle (the least a held GPU costs)
    cpu_core_hour: Decimal  # host CPU and memory work asks for, on demand (CPU-only work pays only these)
    memory_gib_hour: Decimal
    reserved: int = 0  # GPUs active plans reserve (in use by their work or not)


@dataclass(frozen=True)
class Snapshot:
    offers: list[GpuOffer]
    free_by_cluster_model: dict[tuple[str, str], int]
    clusters: dict[str, ClusterRow]
    book: PriceBook
    until: datetime | None = None  # the first active plan's end: the snapshot is stale from then on


@dataclass
class OfferCache:
    """Snapshots and quotes per (inventory version, price version); a server holds one."""

    snapshot_key: tuple[int, int, int] | None = None
    # Misses are computed one at a time (the work is CPU-bound under the GIL anyway), and a request that waited
    # finds the answer the first one computed: a burst of identical quotes costs one plan search, not fifty.
    compute: Lock = field(default_factory=Lock)
    snapshot: Snapshot | None = None
    topologies: dict[tuple[str, str, str], Cluster] = field(default_factory=dict)  # (row, spec digest, model)
    quotes: OrderedDict[tuple[Any, ...], list[dict[str, Any]]] = field(default_factory=OrderedDict)
    lock: Lock = field(default_factory=Lock)


def used_gpus(s: Session) -> dict[str, set[int]]:
    """GPU indices held by open allocations, per node name (a slice holds its GPU too)."""
    used: dict[str, set[int]] = defaultdict(set)
    for (placement,) in s.execute(select(Allocation.placement).where(Allocation.stopped_at.is_(None))):
        for node_name, idx in (placement or {}).items():
            used[node_name].update(int(i) for i in idx)
    return used


def _build(s: Session, book: PriceBook, now: datetime) -> Snapshot:
    used = used_gpus(s)
    held = plans_module.reservations(s, now)
    per_model: dict[str, dict[str, Any]] = {}
    free_dom: dict[tuple[str, str, int], int] = defaultdict(int)
    free_leaf: dict[tuple[str, str, int], int] = defaultdict(int)
    free_cm: dict[tuple[str, str], int] = defaultdict(int)
    rows = s.execute(
        select(Node.name, Node.cluster_id, Node.gpu_model, Node.gpu_count, Node.state, Node.nvlink_domain, Node.leaf)
    )
    for name, cid, model, count, state, dom, leaf in rows:
        if not model or state == "down":
            continue
        m = per_model.setdefault(model, {"total": 0, "free": 0, "nodes": 0})
        m["total"] += count
        m["nodes"] += 1
        if state != "ready":
            continue
        free = count - len(used.get(name, ()))
        m["free"] += free
        free_dom[(model, cid, dom)] += free
        free_leaf[(model, cid, leaf)] += free
        free_cm[(cid, model)] += free
    offers = []
    for model, m in sorted(per_model.items()):
        m["free"] = max(0, m["free"] - held.idle.get(model, 0))
        for cm in [k for k in free_cm if k[1] == model]:  # no one cluster has more free than the model has
            free_cm[cm] = min(free_cm[cm], m["free"])
        spec = catalog.gpu(model)
        on_demand = book.gpu_rate(model) if model in book.gpu_hour else None
        plans = {
            name: exact(on_demand * (1 - p.discount)) for name, p in book.plans.items()
        } if on_demand is not None else {}  # fmt: skip
        slices = {
            p: book.rate(model, 1, "on-demand", milli=mig_milli(p)) for p in spec.mig_profiles
        } if on_demand is not None else {}  # fmt: skip
        offers.append(
            GpuOffer(
                gpu=model,
                memory_gb=spec.memory_GB,
                total=m["total"],
                free=m["free"],
                largest_free_nvlink=min(
                    m["free"], max((v for (mm, _, _), v in free_dom.items() if mm == model), default=0)
                ),
                largest_free_leaf=min(
                    m["free"], max((v for (mm, _, _), v in free_leaf.items() if mm == model), default=0)
                ),
                nodes=m["nodes"],
                currency=book.currency,
                on_demand=on_demand,
                spot=book.gpu_rate(model, "spot") if on_demand is not None else None,
                plans=plans,
                slices=slices,
                usage=book.gpu_rate(model, "usage") if book.offered(model, "usage") else None,
                usage_floor=book.usage_floor_rate(model) if book.offered(model, "usage") else None,
                cpu_core_hour=book.cpu_core_hour,
                memory_gib_hour=book.memory_gib_hour,
                reserved=held.reserved.get(model, 0),
            )
        )
    clusters = {c.id: c for c in s.scalars(select(ClusterRow))}
    return Snapshot(offers, dict(free_cm), clusters, book, held.until)


_VERSIONS = select(
    select(KeyValue.value).where(KeyValue.key == inventory.INVENTORY_VERSION).scalar_subquery(),
    select(func.max(PriceBookVersion.id)).scalar_subquery(),
    select(KeyValue.value).where(KeyValue.key == plans_module.PLANS_VERSION).scalar_subquery(),
)


def _versions(s: Session) -> tuple[int, int, int]:
    """(inventory, price-book, plans) versions in one round trip: what a cached snapshot is valid for."""
    inv, price, plan = s.execute(_VERSIONS).one()
    return inv or 0, price or 0, plan or 0


def _fresh(cache: OfferCache, key: tuple[int, int, int], now: datetime) -> bool:
    snap = cache.snapshot
    return cache.snapshot_key == key and snap is not None and (snap.until is None or now < snap.until)


def snapshot(s: Session, cache: OfferCache, now: datetime | None = None) -> Snapshot:
    now = now or utcnow()
    key = _versions(s)
    if _fresh(cache, key, now):
        assert cache.snapshot is not None
        return cache.snapshot
    with cache.compute:
        if _fresh(cache, key, now):
            assert cache.snapshot is not None
            return cache.snapshot
        snap = _build(s, prices.current(s)[1], now)
        with cache.lock:
            cache.snapshot_key, cache.snapshot = key, snap
            cache.quotes.clear()
    return snap


def _topology(cache: OfferCache, row: ClusterRow, model: str) -> Cluster | None:
    """The part of a registered cluster made of one GPU model (quotes price one model at a time)."""
    key = (*inventory.topology_key(row), model)
    if key not in cache.topologies:
        groups = [g for g in row.spec.get("node_groups", []) if catalog.gpu(g["gpu"]).name == model]
        if not groups:
            return None
        spec = {k: v for k, v in row.spec.items() if k != "host"} | {"node_groups": groups}
        cache.topologies[key] = inventory.build_cluster(spec)
    return cache.topologies[key]


def quotes(
    s: Session,
    cache: OfferCache,
    job: TrainJob,
    tokens: float,
    *,
    gpu: str | None = None,
    gpus: int | None = None,
    mode: BillingMode = "on-demand",
    rank: Rank = "cheapest",
    limit: int = 10,
    host_per_gpu: tuple[int, int] = (0, 0),
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Feasible (offer, GPU count) choices for the job, best first by `rank`, each with time and cost; with the
    host CPU (milli-cores) and memory (MiB) a GPU asks for priced in."""
    model_filter = None
    if gpu:
        try:
            spec = catalog.gpu(gpu)
        except catalog.CatalogError as e:
            raise Invalid(f"gpu: {e}") from e
        model_filter = spec.name
        gap = precision_gap(spec, job.precision)
        if gap:
            raise Invalid(f"precision: {gap}")
    snap = snapshot(s, cache, now)
    key = (job, tokens, model_filter, gpus, mode, rank, limit, host_per_gpu)
    with cache.lock:
        if key in cache.quotes:
            cache.quotes.move_to_end(key)
            return cache.quotes[key]
    with cache.compute:
        with cache.lock:
            if key in cache.quotes:
                return cache.quotes[key]
        out = _quote(cache, snap, job, tokens, model_filter, gpus, mode, rank, limit, host_per_gpu)
        with cache.lock:
            cache.quotes[key] = out
            while len(cache.quotes) > 256:
                cache.quotes.popitem(last=False)
    return out


def _quote(
    cache: OfferCache,
    snap: Snapshot,
    job: TrainJob,
    tokens: float,
    model_filter: str | None,
    gpus: int | None,
    mode: BillingMode,
    rank: Rank,
    limit: int,
    host_per_gpu: tuple[int, int],
) -> list[dict[str, Any]]:
    found: list[tuple[Quote, str]] = []
    room = False  # some priced offer has `gpus` GPUs free: then an empty answer means no plan fits that count
    for (cid, model), free in sorted(snap.free_by_cluster_model.items()):
        if (model_filter and model != model_filter) or not snap.book.offered(model, mode):
            continue
        topo = _topology(cache, snap.clusters[cid], model)
        if topo is None or (gpus and gpus > topo.n_gpus):
            continue
        room = room or (gpus is not None and free >= gpus)
        offer = [QuoteOffer(topo, free)]
        for q in quote(job, tokens, offer, snap.book, gpus=gpus, mode=mode, rank=rank, limit=limit, host=host_per_gpu):
            found.append((q, snap.clusters[cid].name))
    order = (
        (lambda t: (t[0].cost, t[0].total_time_s)) if rank == "cheapest" else (lambda t: (t[0].total_time_s, t[0].cost))
    )
    if not found and room:
        raise Invalid(f"gpus: no parallel plan of the model fits on {gpus} GPUs (data x tensor x pipeline parallel "
                      "must make that count, the tensor degree must divide the heads, and the data degree the global "
                      "batch); try a count such as a power of two")  # fmt: skip
    best = sorted(found, key=order)[:limit]
    return [{**q.as_dict(), "cluster": name, "currency": snap.book.currency} for q, name in best]
