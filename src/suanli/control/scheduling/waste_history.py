"""Waste over time: per UTC hour, the GPU-hours the registered GPUs offered and the GPU-hours work held, from the
allocations themselves (every workload's GPUs from start to stop), so the history needs no sampler of its own.

Capacity counts each node's GPUs from the node's registration to now, except nodes down now (out of service).
Idle = capacity − held, never below zero. GPU-hours are floats: they are not money.

Waste is what docs/scheduling.md and `suanli sim` call waste: GPUs idle while work waited for GPUs. It is
integrated exactly (integer milli-GPU-microseconds) over the instants at which capacity, holdings or the queue
change: at each instant min(idle GPUs, GPUs asked for by the workloads pending then). When a workload was pending
comes from its own events (every state change is one), so a requeued workload's earlier waits count too.
Held-but-idle is the held GPU-hours times the idle share the GPUs' stored readings show for that hour (the
readings usage billing charges from); an hour without readings of held GPUs has none (None, not 0)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from suanli.db.models import Allocation, Node, Workload, WorkloadEvent
from suanli.db.telemetry import GpuSampleRow
from suanli.workloads.spec import WorkloadSpec

MAX_HOURS = 24 * 31
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HOUR_MS = 3_600_000
_MILLI_US_PER_GPU_HOUR = 1000 * 3_600_000_000  # milli-GPU-microseconds in one GPU-hour
_ZERO = timedelta(0)


def _overlap(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds())


def _us(d: timedelta) -> int:
    return d // timedelta(microseconds=1)


def _gpu_hours(milli_us: int) -> str:
    return str((Decimal(milli_us) / _MILLI_US_PER_GPU_HOUR).quantize(Decimal("0.001")))


def _demand_milli(spec: dict[str, Any]) -> int:
    """The milli-GPUs a pending workload asks for (a MIG slice its share); 0 when its spec does not parse."""
    try:
        w = WorkloadSpec.model_validate(spec)
    except ValueError:
        return 0
    return w.gpu_count() * w.milli()


def pending_spans(s: Session, since: datetime, now: datetime) -> list[tuple[datetime, datetime, int]]:
    """(from, to, milli-GPUs asked for) of every wait for GPUs that overlaps [since, now): from a `pending` event to
    the workload's next event in another state (or now). A workload without events (none on record) waited from its
    creation to its start, or its end if it never started. Two queries, whatever the window."""
    live = or_(Workload.finished_at.is_(None), Workload.finished_at > since)
    rows = s.execute(
        select(Workload.id, Workload.spec, Workload.state, Workload.created_at, Workload.started_at,
               Workload.finished_at)
        .where(Workload.created_at < now, live)
    ).all()  # fmt: skip
    demand = {r.id: m for r in rows if (m := _demand_milli(r.spec)) > 0}
    if not demand:
        return []
    events: dict[str, list[tuple[datetime, str]]] = defaultdict(list)
    q = (select(WorkloadEvent.workload_id, WorkloadEvent.at, WorkloadEvent.state)
         .join(Workload, Workload.id == WorkloadEvent.workload_id)
         .where(Workload.created_at < now, live, WorkloadEvent.at < now)
         .order_by(WorkloadEvent.workload_id, WorkloadEvent.at, WorkloadEvent.id))  # fmt: skip
    for wid, at, state in s.execute(q):
        if wid in demand:
            events[wid].append((at, state))
    out: list[tuple[datetime, datetime, int]] = []
    for r in rows:
        m = demand.get(r.id)
        if m is None:
            continue
        evs = events.get(r.id)
        if not evs:
            end = r.started_at or r.finished_at or (now if r.state == "pending" else r.created_at)
            spans = [(r.created_at, end)]
        else:
            spans, start = [], None
            for at, state in evs:
                if state == "pending" and start is None:
                    start = at
                elif state != "pending" and start is not None:
                    spans.append((start, at))
                    start = None
            if start is not None:
                spans.append((start, now))
        out.extend((a, min(b, now), m) for a, b in spans if min(b, now) > max(a, since))
    return out


def _waste(nodes: list[Any], held: list[Any], waits: list[tuple[datetime, datetime, int]], edges: list[datetime],
           now: datetime) -> list[int]:  # fmt: skip
    """Milli-GPU-microseconds idle while work waited, per hour: ∫ min(max(capacity − held, 0), asked) dt."""
    changes: dict[datetime, list[int]] = defaultdict(lambda: [0, 0, 0])  # Δcapacity, Δheld, Δasked (milli-GPUs)
    for created, n in nodes:
        changes[min(created, now)][0] += n * 1000
    for a, b, g, m in held:
        changes[a][1] += g * m
        if b is not None and b < now:
            changes[b][1] -= g * m
    for a, b, m in waits:
        changes[a][2] += m
        if b < now:
            changes[b][2] -= m
    for h in edges:
        changes.setdefault(h, [0, 0, 0])
    changes.setdefault(now, [0, 0, 0])
    out = [0] * len(edges)
    cap = use = asked = 0
    times = sorted(changes)
    slot = -1
    for t, nxt in zip(times, [*times[1:], now], strict=True):
        dc, dh, da = changes[t]
        cap, use, asked = cap + dc, use + dh, asked + da
        while slot + 1 < len(edges) and edges[slot + 1] <= t:
            slot += 1
        if slot < 0 or t >= now or nxt <= t:
            continue
        rate = min(max(cap - use, 0), asked)
        if rate > 0:
            out[slot] += rate * _us(min(nxt, now) - t)
    return out


def _held_idle_share(s: Session, since: datetime, now: datetime) -> dict[int, float]:
    """Per hour (ms since the epoch // one hour): 1 − the mean utilisation of the readings of GPUs held then (a
    reading names its holder; one that failed or is out of 0–100 % is no reading). One grouped query."""
    r = GpuSampleRow
    lo, hi = (since - _EPOCH) // timedelta(milliseconds=1), (now - _EPOCH) // timedelta(milliseconds=1)
    bucket = r.t_ms // _HOUR_MS
    q = (select(bucket, func.count(), func.sum(r.util))
         .where(r.t_ms >= lo, r.t_ms < hi, r.workload != "", r.error == "", r.util >= 0, r.util <= 100)
         .group_by(bucket))  # fmt: skip
    return {int(b): 1 - float(total) / int(n) / 100 for b, n, total in s.execute(q) if n}


def by_hour(s: Session, hours: int, now: datetime) -> list[dict[str, Any]]:
    """[{hour, capacity_gpu_hours, held_gpu_hours, idle_gpu_hours, idle_fraction, waste_gpu_hours,
    held_idle_gpu_hours}] for the last `hours` UTC hours (the current one up to now), oldest first."""
    top = now.replace(minute=0, second=0, microsecond=0)
    edges = [top - timedelta(hours=hours - 1 - i) for i in range(hours)]
    since = edges[0]
    nodes = list(s.execute(select(Node.created_at, Node.gpu_count).where(Node.state != "down", Node.gpu_count > 0)))
    held = list(s.execute(
        select(Allocation.started_at, Allocation.stopped_at, Allocation.gpus, Allocation.milli)
        .where(Allocation.gpus > 0, Allocation.started_at < now,
               or_(Allocation.stopped_at.is_(None), Allocation.stopped_at > since))
    ))  # fmt: skip
    waste = _waste(nodes, held, pending_spans(s, since, now), edges, now)
    idle_share = _held_idle_share(s, since, now)
    out = []
    for i, h0 in enumerate(edges):
        h1 = min(h0 + timedelta(hours=1), now)
        cap = sum(n * _overlap(h0, h1, c, now) for c, n in nodes) / 3600
        use = sum(g * m / 1000 * _overlap(h0, h1, a, b or now) for a, b, g, m in held) / 3600
        use = min(use, cap) if cap else use
        idle = max(cap - use, 0.0)
        share = idle_share.get((h0 - _EPOCH) // timedelta(milliseconds=_HOUR_MS))
        held_idle = None if share is None else str(Decimal(repr(max(use * share, 0.0))).quantize(Decimal("0.001")))
        out.append({"hour": h0, "capacity_gpu_hours": round(cap, 4), "held_gpu_hours": round(use, 4),
                    "idle_gpu_hours": round(idle, 4), "idle_fraction": round(idle / cap, 4) if cap else None,
                    "waste_gpu_hours": _gpu_hours(waste[i]), "held_idle_gpu_hours": held_idle})  # fmt: skip
    return out
