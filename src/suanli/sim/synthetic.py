"""Synthetic workloads: deterministic job lists drawn from simple distributions (no I/O).

Arrivals are Poisson (exponential gaps, mean `mean_interarrival_s`, the first job at 0 s); sizes are drawn from
`gpu_sizes` with `size_weights` (default: mostly 1-GPU jobs with a tail of large ones); durations are lognormal
(``exp(N(duration_log_mean, duration_log_sigma))`` seconds, at least `min_duration_s`); tenants ``tenant-0`` …
are uniform; a `spot_fraction` of jobs is spot (the rest on-demand); an `elastic_fraction` is elastic with
``min_gpus = 1`` and ``max_gpus = min(4 × num_gpus, max(gpu_sizes))``. Same arguments and seed → same jobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from suanli.sim.workload import TraceJob

DEFAULT_GPU_SIZES = (1, 2, 4, 8, 16, 32, 64)
#: Skewed to small jobs like production traces (Philly is 93% 1-GPU), with a heavier tail of large jobs than
#: Philly so that multi-node placement is exercised. Used when `gpu_sizes` is the default; otherwise uniform.
DEFAULT_SIZE_WEIGHTS = (0.70, 0.10, 0.09, 0.07, 0.025, 0.01, 0.005)


def synthetic_jobs(
    n: int,
    seed: int,
    *,
    mean_interarrival_s: float = 60.0,
    gpu_sizes: Sequence[int] = DEFAULT_GPU_SIZES,
    size_weights: Sequence[float] | None = None,
    duration_log_mean: float = math.log(1800.0),
    duration_log_sigma: float = 1.5,
    min_duration_s: float = 1.0,
    tenants: int = 4,
    spot_fraction: float = 0.1,
    elastic_fraction: float = 0.1,
) -> list[TraceJob]:
    """`n` jobs ``syn-000001`` … sorted by submit time, drawn with ``numpy.random.default_rng(seed)``."""
    sizes = [int(s) for s in gpu_sizes]
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not sizes or min(sizes) < 1:
        raise ValueError(f"gpu_sizes must be non-empty and >= 1, got {tuple(gpu_sizes)}")
    if size_weights is None:
        size_weights = DEFAULT_SIZE_WEIGHTS if tuple(sizes) == DEFAULT_GPU_SIZES else [1.0] * len(sizes)
    weights = np.asarray(size_weights, dtype=float)
    if weights.shape != (len(sizes),) or (weights < 0).any() or not weights.sum() > 0:
        raise ValueError(f"size_weights must be {len(sizes)} non-negative numbers with a positive sum")
    if not (mean_interarrival_s > 0 and duration_log_sigma >= 0 and min_duration_s >= 0 and tenants >= 1):
        raise ValueError("need mean_interarrival_s > 0, duration_log_sigma >= 0, min_duration_s >= 0, tenants >= 1")
    for name, value in (("spot_fraction", spot_fraction), ("elastic_fraction", elastic_fraction)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value}")

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(mean_interarrival_s, size=n)
    submit = np.cumsum(gaps) - (gaps[0] if n else 0.0)
    size = rng.choice(np.asarray(sizes), size=n, p=weights / weights.sum())
    duration = np.maximum(rng.lognormal(duration_log_mean, duration_log_sigma, size=n), min_duration_s)
    tenant = rng.integers(0, tenants, size=n)
    spot = rng.random(n) < spot_fraction
    elastic = rng.random(n) < elastic_fraction
    largest = max(sizes)

    jobs = []
    for i in range(n):
        g = int(size[i])
        jobs.append(
            TraceJob(
                job_id=f"syn-{i + 1:06d}",
                submit_time_s=float(submit[i]),
                num_gpus=g,
                duration_s=float(duration[i]),
                tenant=f"tenant-{int(tenant[i])}",
                priority="spot" if spot[i] else "on-demand",
                min_gpus=1 if elastic[i] else None,
                max_gpus=max(g, min(4 * g, largest)) if elastic[i] else None,
            )
        )
    return jobs
