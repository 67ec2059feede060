"""Trace jobs: the workload records every trace reader produces and the simulator consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PriorityClass = Literal["reserved", "on-demand", "spot"]
PRIORITY_RANK: dict[str, int] = {"reserved": 2, "on-demand": 1, "spot": 0}


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. `duration_s` was measured on the reference placement (compact, as recorded).

    `gpu_fraction` < 1 is a shared slice of one GPU (Alibaba's GPU-sharing pods, MIG-style work); whole-GPU
    jobs have 1.0. Elastic jobs give `min_gpus`/`max_gpus`; `num_gpus` is what they asked for. `cpu_milli` and
    `memory_mib` (0: not stated) count against node hosts on clusters whose spec states cores and memory.
    """

    job_id: str
    submit_time_s: float
    num_gpus: int
    duration_s: float
    tenant: str = "default"
    gpu_type: str | None = None
    priority: PriorityClass = "on-demand"
    model: str | None = None
    min_gpus: int | None = None
    max_gpus: int | None = None
    gpu_fraction: float = 1.0
    cpu_milli: int = 0
    memory_mib: int = 0

    def __post_init__(self) -> None:
        if self.num_gpus < 0:
            raise ValueError(f"job {self.job_id}: num_gpus must be >= 0")
        if self.duration_s < 0:
            raise ValueError(f"job {self.job_id}: duration_s must be >= 0")
        if not 0.0 < self.gpu_fraction <= 1.0:
            raise ValueError(f"job {self.job_id}: gpu_fraction must be in (0, 1]")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"job {self.job_id}: cpu_milli and memory_mib must be >= 0")
        if self.gpu_fraction < 1.0 and self.num_gpus != 1:
            raise ValueError(f"job {self.job_id}: a fractional GPU request must ask for exactly one GPU")

    @property
    def gpu_seconds(self) -> float:
        return self.num_gpus * self.gpu_fraction * self.duration_s
