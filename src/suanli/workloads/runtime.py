"""How long a workload will run on a placement, from the performance model: a training job that names its
model and token count runs `tokens / tokens_per_s` of the fastest parallel plan that fits on those GPUs.

Virtual nodes run a workload for exactly this long (unless it declares `duration`), so a scattered gang of the
same job finishes later than a compact one, as it would on real hardware. A run longer than RUNTIME_CAP_S (ten
years: work that will be stopped long before) is said to last that long, so every prediction fits in a date. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from suanli.perf import Placement, PlanError, TrainJob, model_preset, search
from suanli.topology import Cluster
from suanli.workloads.models import WorkloadSpec

RUNTIME_CAP_S = 10 * 365 * 86400.0


def predicted_runtime(spec: WorkloadSpec, cluster: Cluster, gpus: Sequence[int]) -> float | None:
    """Seconds, or None when the spec does not say enough (no model or no token count) or no plan fits."""
    model = spec.model
    if model is None or model.tokens is None or not gpus:
        return None
    job = TrainJob(arch=model_preset(model.preset), precision=model.precision)
    try:
        best = search(job, Placement(cluster, np.asarray(sorted(gpus), dtype=np.int64)), top=1)[0]
    except PlanError:
        return None
    if best.tokens_per_s <= 0:
        return None
    return min(RUNTIME_CAP_S, float(model.tokens / best.tokens_per_s))


def load_profile(spec: WorkloadSpec, cluster: Cluster, gpus: Sequence[int]) -> tuple[float, float] | None:
    """(busy, compute) of a training step on the placement, from the best plan's time breakdown: `busy` is the
    share of the step a GPU runs kernels (pipeline bubbles are idle), `compute` the share of busy time that is
    math rather than exposed communication. None when the spec names no model or no plan fits."""
    model = spec.model
    if model is None or not gpus:
        return None
    job = TrainJob(arch=model_preset(model.preset), precision=model.precision)
    try:
        best = search(job, Placement(cluster, np.asarray(sorted(gpus), dtype=np.int64)), top=1)[0]
    except PlanError:
        return None
    parts, step = best.breakdown, best.step_time_s
    if step <= 0:
        return None
    math = sum(parts.get(k, 0.0) for k in ("compute_linear", "compute_attention", "elementwise", "recompute",
                                              "optimizer"))  # fmt: skip
    busy = max(0.0, min(1.0, 1.0 - parts.get("pp_bubble", 0.0) / step))
    return busy, max(0.0, min(1.0, math / max(busy * step, 1e-12)))
