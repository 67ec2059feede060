"""What operators and tenants read about GPUs: a node's or a workload's series, every GPU's latest reading, the
cluster summary, and the inputs of the Prometheus exposition. Recipes over `control.telemetry.telemetry` reads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.control import leases
from suanli.control.errors import Invalid
from suanli.control.money import offers
from suanli.control.scheduling import inventory
from suanli.control.telemetry import telemetry
from suanli.control.telemetry.telemetry import Latest, Retention
from suanli.db.engine import Database
from suanli.db.models import Allocation, Gpu, Node, Workload
from suanli.sched.types import FULL
from suanli.telemetry import exposition

TEMP_BANDS = (40, 50, 60, 70, 80, 85, 90, 95)  # °C upper bounds of the summary's temperature histogram


def _utc(t: datetime | None) -> datetime | None:
    """A time without a zone is UTC (the API's convention)."""
    return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t


def _range(
    since: datetime | None, until: datetime | None, now: datetime, default: timedelta
) -> tuple[datetime, datetime]:
    since, until = _utc(since), _utc(until)
    until = min(until or now, now)
    if until.year < 1971:
        raise Invalid("until: must be after 1970")
    since = max(since or until - default, datetime(1970, 1, 1, tzinfo=UTC))
    if since >= until:
        raise Invalid("since: must be before until (and before now)")
    return since, until


def _resolution(asked: str, since: datetime, until: datetime, keep: Retention, now: datetime) -> str:
    if asked == "auto":
        return telemetry.resolution_for(since, until, keep, now)
    if asked not in telemetry.RESOLUTIONS:
        raise Invalid(f"resolution: one of auto, {', '.join(telemetry.RESOLUTIONS)}")
    return asked


def node_metrics(s: Session, node_ref: str, since: datetime | None, until: datetime | None, resolution: str,
                 now: datetime, keep: Retention) -> dict[str, Any]:  # fmt: skip
    node = inventory.node(s, node_ref)
    lo, hi = _range(since, until, now, timedelta(minutes=15))
    res = _resolution(resolution, lo, hi, keep, now)
    gpus = inventory.gpus_of(s, node.id)
    pts = telemetry.series(s, [(g.id, telemetry.ms(lo), telemetry.ms(hi)) for g in gpus], res)
    return {"node": node.name, "since": lo, "until": hi, "resolution": res,
            "gpus": [{"gpu": g.index, "uuid": g.uuid, "model": g.model, "healthy": g.healthy,
                      "points": pts.get(g.id, [])} for g in gpus]}  # fmt: skip


MAX_WINDOWS = 256  # GPU windows one answer shows (the newest): a workload resized a thousand times has as many


def workload_metrics(s: Session, w: Workload, since: datetime | None, until: datetime | None, resolution: str,
                     now: datetime, keep: Retention) -> dict[str, Any]:  # fmt: skip
    """Only the GPUs the workload held, and only while it held them (every attempt)."""
    allocs = list(s.scalars(select(Allocation).where(Allocation.workload == w.id).order_by(Allocation.started_at)))
    start = allocs[0].started_at if allocs else w.created_at  # by default: its whole life on GPUs
    lo, hi = _range(since or start, until, now, timedelta(minutes=15))
    res = _resolution(resolution, lo, hi, keep, now)
    names = {n for a in allocs for n in (a.placement or {})}
    rows = s.execute(select(Node.name, Gpu.index, Gpu.id, Gpu.uuid).join(Gpu, Gpu.node_id == Node.id)
                     .where(Node.name.in_(names))).all() if names else []  # fmt: skip
    gpu_rows = {(n, i): (gid, uuid) for n, i, gid, uuid in rows}
    spans: dict[tuple[str, int, bool], list[list[datetime]]] = {}
    for a in allocs:  # oldest first
        a_lo, a_hi = max(lo, a.started_at), min(hi, a.stopped_at or now)
        if a_lo > a_hi:
            continue
        for node, idx in (a.placement or {}).items():
            for g in idx:
                if (node, int(g)) in gpu_rows:
                    held_on = spans.setdefault((node, int(g), a.milli >= FULL), [])
                    if held_on and a_lo <= held_on[-1][1]:  # a resize kept this GPU: one window, not two
                        held_on[-1][1] = max(held_on[-1][1], a_hi)
                    else:
                        held_on.append([a_lo, a_hi])
    held = sorted(((node, g, *gpu_rows[(node, g)], a_lo, a_hi, whole) for (node, g, whole), ws in spans.items()
                   for a_lo, a_hi in ws), key=lambda h: (h[5], h[4], h[0], h[1]))  # fmt: skip
    left_out = max(0, len(held) - MAX_WINDOWS)  # those that ended last are shown: each window is a query
    held = sorted(held[left_out:], key=lambda h: (h[4], h[0], h[1]))
    pts = {}
    for node, g, gid, _, a_lo, a_hi, whole in held:
        window = [(gid, telemetry.ms(a_lo), telemetry.ms(a_hi))]
        pts[(node, g, a_lo)] = telemetry.series(s, window, res, workload=w.id, whole=whole).get(gid, [])
    return {"workload": w.id, "name": w.name, "since": lo, "until": hi, "resolution": res,
            "windows_left_out": left_out,
            "gpus": [{"node": node, "gpu": g, "uuid": uuid, "from": a_lo, "to": a_hi, "points": pts[(node, g, a_lo)]}
                     for node, g, _, uuid, a_lo, a_hi, _ in held]}  # fmt: skip


def gpu_rows(latest: list[Latest], now: datetime) -> list[dict[str, Any]]:
    out = []
    for x in latest:
        t = x.sample
        r = t.sample if t else None
        out.append({"node": x.node, "node_state": x.node_state, "gpu": x.gpu, "uuid": x.uuid, "model": x.model,
                    "healthy": x.healthy, "health_reason": x.health_reason, "memory_mib": x.memory_mib,
                    "t": telemetry.at(int(r.t * 1000)) if r else None,
                    "age_s": round(now.timestamp() - r.t, 1) if r else None,
                    "util": r.util if r else None, "temp_c": r.temp_c if r else None,
                    "mem_used_mib": r.mem_used_mib if r else None, "power_w": r.power_w if r else None,
                    "sm_clock_mhz": r.sm_clock_mhz if r else None, "xid": r.xid if r else None,
                    "error": r.error if r else "", "workload": t.workload if t else "",
                    "org": t.org if t else ""})  # fmt: skip
    return out


@dataclass(frozen=True)
class LoopFigures:
    """What the scheduling leader reported with its lease (see `WorkloadLoop.info`)."""

    info: dict[str, Any]

    @property
    def queued_by_class(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in (self.info.get("queued_by_class") or {}).items()}

    def ratio(self, key: str) -> float:
        gpus = int(self.info.get("gpus") or 0)
        return float(self.info.get(key) or 0) / gpus if gpus and self.queued_by_class else 0.0


def loop_figures(db: Database, now: datetime) -> LoopFigures:
    _, info = leases.holder(db, leases.WORKLOAD_LOOP, now)
    return LoopFigures(info)


def _revenue(s: Session) -> Decimal:
    return s.scalar(select(func.coalesce(func.sum(Allocation.rate_per_hour), 0)).where(
        Allocation.stopped_at.is_(None))) or Decimal(0)  # fmt: skip


def _by_model(latest: list[Latest], used: dict[str, set[int]]) -> dict[str, tuple[int, int, int, int]]:
    """(allocated, free, unhealthy, draining) GPUs by model: a GPU of a node taken down counts as unhealthy, an idle
    one of a draining node as draining (no new work lands there), so `free` is what offers call free."""
    counts: dict[str, list[int]] = {}
    for x in latest:
        c = counts.setdefault(x.model, [0, 0, 0, 0])
        held = x.gpu in used.get(x.node, ())
        if not x.healthy or x.node_state == "down":
            c[2] += 1
        elif held:
            c[0] += 1
        elif x.node_state != "ready":
            c[3] += 1
        else:
            c[1] += 1
    return {m: (a, f, u, d) for m, (a, f, u, d) in counts.items()}


def summary(s: Session, latest: list[Latest], loop: LoopFigures, currency: str) -> dict[str, Any]:
    read = [x.sample.sample for x in latest if x.sample is not None and not x.sample.sample.error]
    temps = [r.temp_c for r in read]
    bands = Counter(next((b for b in TEMP_BANDS if t <= b), None) for t in temps)
    info = loop.info
    return {
        "gpus": {"total": len(latest), "reporting": len(read),
                 "by_model": [{"model": m, "allocated": a, "free": f, "unhealthy": u, "draining": d}
                              for m, (a, f, u, d) in sorted(_by_model(latest, offers.used_gpus(s)).items())]},
        "utilisation": {"avg": sum(r.util for r in read) / len(read) if read else None,
                        "allocated_avg": _avg([x.sample.sample.util for x in latest
                                               if x.sample and x.sample.workload and not x.sample.sample.error])},
        "temperature": {"p50": _pct(temps, 0.5), "p90": _pct(temps, 0.9), "max": max(temps, default=None),
                        "bands": [{"le": b, "gpus": bands.get(b, 0)} for b in TEMP_BANDS]
                        + [{"le": None, "gpus": bands.get(None, 0)}]},
        "unhealthy": [{"node": x.node, "gpu": x.gpu, "reason": x.health_reason} for x in latest if not x.healthy],
        "nodes": dict(Counter(st for (st,) in s.execute(select(Node.state)).all())),
        "queue": loop.queued_by_class,
        "waste": {"idle_gpus": int(info.get("idle") or 0), "fragmented_gpus": int(info.get("fragmented") or 0),
                  "schedulable_gpus": int(info.get("gpus") or 0), "waste_fraction": loop.ratio("idle"),
                  "fragmentation": loop.ratio("fragmented"),
                  "waste_gpu_hours": float(info.get("waste_gpu_s") or 0) / 3600,
                  "queued_gpu_hours": float(info.get("queued_gpu_s") or 0) / 3600},
        "revenue_per_hour": str(_revenue(s)), "currency": currency,
    }  # fmt: skip


def _avg(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _pct(xs: list[float], q: float) -> float | None:
    return telemetry.percentile(xs, q) if xs else None


def exposition_inputs(s: Session, latest: list[Latest], loop: LoopFigures, currency: str
                      ) -> tuple[list[exposition.GpuSeries], exposition.Platform]:  # fmt: skip
    series = [exposition.GpuSeries(x.sample, x.node, x.healthy) for x in latest if x.sample is not None]
    info = loop.info
    bounds, counts = info.get("pass_buckets") or [], info.get("pass_counts") or []
    cumulative, total = [], 0
    for le, n in zip([*bounds, float("inf")], counts, strict=False):
        total += int(n)
        cumulative.append((float(le), total))
    platform = exposition.Platform(
        queue_by_class=loop.queued_by_class, gpus_by_model=_by_model(latest, offers.used_gpus(s)),
        waste_fraction=loop.ratio("idle"), fragmentation=loop.ratio("fragmented"),
        waste_gpu_seconds=float(info.get("waste_gpu_s") or 0), queued_capacity_gpu_seconds=float(
            info.get("queued_gpu_s") or 0),
        revenue_per_hour=float(_revenue(s)), currency=currency,
        sched_latency_buckets=cumulative if cumulative and cumulative[-1][0] == float("inf") else [],
        sched_latency_sum=float(info.get("pass_sum") or 0),
        nodes_by_state=dict(Counter(st for (st,) in s.execute(select(Node.state)).all())),
        unhealthy_gpus=sum(not x.healthy for x in latest),
    )  # fmt: skip
    return series, platform
