"""Cutting and reshaping job lists: pure functions over `TraceJob`s (no I/O, inputs never changed).

Every function returns the jobs sorted by submit time (stable: ties keep their input order).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from suanli.sim.workload import TraceJob


def _sorted(jobs: Iterable[TraceJob]) -> list[TraceJob]:
    return sorted(jobs, key=lambda j: j.submit_time_s)


def rebase(jobs: Iterable[TraceJob]) -> list[TraceJob]:
    """Sorted by submit time and shifted so the first job arrives at 0 s."""
    ordered = _sorted(jobs)
    if not ordered:
        return []
    t0 = ordered[0].submit_time_s
    if t0 == 0:
        return ordered
    return [replace(j, submit_time_s=j.submit_time_s - t0) for j in ordered]


def first_n(jobs: Iterable[TraceJob], n: int) -> list[TraceJob]:
    """The `n` earliest jobs (all of them if there are fewer), times unchanged."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return _sorted(jobs)[:n]


def time_window(jobs: Iterable[TraceJob], start_s: float, end_s: float) -> list[TraceJob]:
    """Jobs submitted in ``[start_s, end_s)``, re-based so the first of them arrives at 0 s."""
    if not (math.isfinite(start_s) and start_s <= end_s):
        raise ValueError(f"need a finite start_s <= end_s, got [{start_s}, {end_s})")
    return rebase(j for j in jobs if start_s <= j.submit_time_s < end_s)


def scale_load(jobs: Iterable[TraceJob], factor: float) -> list[TraceJob]:
    """Arrival-rate scaling: every inter-arrival gap divided by `factor` (2 = twice the load), order kept.

    The first job keeps its submit time; job ``i`` arrives at ``t0 + (t_i - t0) / factor``, so the span of
    submit times is multiplied by ``1 / factor``. Durations and sizes are unchanged.
    """
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a finite number > 0, got {factor}")
    ordered = _sorted(jobs)
    if not ordered or factor == 1:
        return ordered
    t0 = ordered[0].submit_time_s
    return [replace(j, submit_time_s=t0 + (j.submit_time_s - t0) / factor) for j in ordered]
