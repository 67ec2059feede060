"""How fast a job runs on the GPUs it got, relative to the compact placement its trace duration was measured on.

A trace records how long a job took on its (compact) reference placement. On another placement its
step time changes only in its communication part. With `comm_fraction` c of the reference step spent
in exposed gradient all-reduce (default 10%, or derived from the performance model when the job names a
model preset), the job runs `slowdown = (1 - c) + c * t_comm(placement) / t_comm(reference)` times
slower, where both all-reduce times come from `perf.collectives` on the real GPUs: a gang scattered
across leaves, or behind an oversubscribed spine, is slower, exactly as on hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from suanli.perf import collectives
from suanli.sched.scaling import DEFAULT_COMM_FRACTION, DEFAULT_GRAD_BYTES, ScalingModel, grad_bytes_for
from suanli.topology.model import Cluster


@dataclass
class RuntimeModel:
    cluster: Cluster
    comm_fraction: float = DEFAULT_COMM_FRACTION
    grad_bytes: float = DEFAULT_GRAD_BYTES
    _scaling: ScalingModel = field(init=False, repr=False)
    _cache: dict[tuple, float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._scaling = ScalingModel(self.cluster, self.comm_fraction)  # shares the compact reference times

    def slowdown(self, gpus: NDArray[np.int64], model: str | None = None) -> float:
        """>= 1 when the placement is worse than compact; 1.0 for single-node jobs."""
        k = int(gpus.size)
        if k <= 1:
            return 1.0
        c = self.cluster
        nodes = c.gpu_node[gpus]
        if nodes.min() == nodes.max():
            return 1.0
        span = c.span(gpus)
        _, per_node = np.unique(nodes, return_counts=True)
        group = int(c.node_group[nodes[0]])
        key = (k, group, span["nvlink"], span["node"], span["leaf"], span["spine"], int(per_node.min()), model)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        grad = grad_bytes_for(model, self.grad_bytes)
        actual = collectives.estimate("all_reduce", int(grad), c.comm_group(gpus)).time_us
        ratio = actual / self._scaling.allreduce_us(k, grad, group)
        value = max(1.0, (1.0 - self.comm_fraction) + self.comm_fraction * ratio)
        self._cache[key] = value
        return value
