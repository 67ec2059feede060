"""Waste over time: per UTC hour, the GPU-hours the registered GPUs offered and the GPU-hours work held, from the
allocations themselves (every workload's GPUs from start to stop), so the history needs no sampler of its own.

Capacity counts each node's GPUs from the node's registration to now, except nodes down now (out of service).
Idle = capacity − held, never below zero. GPU-hours are floats: they are not money."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from suanli.db.models import Allocation, Node

MAX_HOURS = 24 * 31


def _overlap(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds())


def by_hour(s: Session, hours: int, now: datetime) -> list[dict[str, Any]]:
    """[{hour, capacity_gpu_hours, held_gpu_hours, idle_gpu_hours, idle_fraction}] for the last `hours` UTC hours
    (the current one up to now), oldest first."""
    top = now.replace(minute=0, second=0, microsecond=0)
    edges = [top - timedelta(hours=hours - 1 - i) for i in range(hours)]
    since = edges[0]
    nodes = list(s.execute(select(Node.created_at, Node.gpu_count).where(Node.state != "down", Node.gpu_count > 0)))
    held = list(s.execute(
        select(Allocation.started_at, Allocation.stopped_at, Allocation.gpus, Allocation.milli)
        .where(Allocation.gpus > 0, Allocation.started_at < now,
               or_(Allocation.stopped_at.is_(None), Allocation.stopped_at > since))
    ))  # fmt: skip
    out = []
    for h0 in edges:
        h1 = min(h0 + timedelta(hours=1), now)
        cap = sum(n * _overlap(h0, h1, c, now) for c, n in nodes) / 3600
        use = sum(g * m / 1000 * _overlap(h0, h1, a, b or now) for a, b, g, m in held) / 3600
        use = min(use, cap) if cap else use
        idle = max(cap - use, 0.0)
        out.append({"hour": h0, "capacity_gpu_hours": round(cap, 4), "held_gpu_hours": round(use, 4),
                    "idle_gpu_hours": round(idle, 4), "idle_fraction": round(idle / cap, 4) if cap else None})  # fmt: skip
    return out
