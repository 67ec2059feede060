"""Throughput of a data-parallel job as its GPU count changes, from the performance model.

A job that asked for `n_ref` GPUs spends a fraction `c` of each step in exposed gradient all-reduce on its
compact reference placement. Per-step compute shrinks as 1/n with more GPUs (fixed global batch), the
all-reduce does not shrink, and its time on n GPUs comes from `perf.collectives` on a compact set of n
GPUs of this cluster. So

    speedup(n) = (n / n_ref) * (t_c + t_ar(n_ref)) / (t_c + t_ar(n)),   t_c = t_ar(n_ref) * (1 - c) / c

is the throughput on n GPUs relative to the requested size. The elastic policy grows a job while one more
GPU buys at least `GOODPUT_FLOOR` of the throughput an average GPU gives it at its requested size (in the
spirit of Pollux's goodput); the simulator runs resized jobs at this speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from suanli.perf import collectives, model_preset
from suanli.topology.model import Cluster

DEFAULT_COMM_FRACTION = 0.10
DEFAULT_GRAD_BYTES = 4 * 100e6  # fp32 gradients of a 100M-parameter model (ResNet/BERT-era jobs)
GOODPUT_FLOOR = 0.5


def grad_bytes_for(model: str | None, default: float = DEFAULT_GRAD_BYTES) -> float:
    if model:
        try:
            return 2.0 * model_preset(model).params  # bf16 gradients of a known transformer
        except ValueError:
            pass
    return default


@dataclass
class ScalingModel:
    cluster: Cluster
    comm_fraction: float = DEFAULT_COMM_FRACTION
    _ar: dict[tuple[int, float, int | None], float] = field(default_factory=dict, repr=False)

    def allreduce_us(self, n: int, grad_bytes: float, group: int | None = None) -> float:
        """All-reduce time of the gradients on the most compact n GPUs of this cluster (of one node group,
        when given and large enough; a gang too big for it is compacted over the whole cluster)."""
        if n <= 1:
            return 0.0
        c = self.cluster
        if group is not None and c.groups[group].gpus_per_node * c.groups[group].count < n:
            group = None
        key = (n, grad_bytes, group)
        if key not in self._ar:
            gpus = c.compact_gpus(min(n, c.n_gpus), group=group)
            self._ar[key] = collectives.estimate("all_reduce", int(grad_bytes), c.comm_group(gpus)).time_us
        return self._ar[key]

    def speedup(self, n: int, n_ref: int, model: str | None = None) -> float:
        if n_ref <= 0 or n <= 0:
            return 0.0
        if n == n_ref:
            return 1.0
        grad = grad_bytes_for(model)
        ref = self.allreduce_us(n_ref, grad)
        if ref == 0.0:  # a 1-GPU reference: assume the same share would be spent once it spreads
            ref = self.allreduce_us(2, grad)
        t_c = ref * (1.0 - self.comm_fraction) / self.comm_fraction
        return (n / n_ref) * (t_c + self.allreduce_us(n_ref, grad)) / (t_c + self.allreduce_us(n, grad))

    def best_size(self, n_ref: int, lo: int, hi: int, model: str | None = None) -> int:
        """Largest n in [lo, hi] whose every added GPU still pays GOODPUT_FLOOR of the average GPU."""
        worth = GOODPUT_FLOOR / n_ref  # speedup one reference GPU contributes on average
        n = max(lo, 1)
        while n < hi:
            nxt = min(hi, n * 2)
            gain = (self.speedup(nxt, n_ref, model) - self.speedup(n, n_ref, model)) / (nxt - n)
            if gain < worth:
                break
            n = nxt
        return n
