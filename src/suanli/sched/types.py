"""What the scheduler reads (requests, allocations) and what it decides (place, preempt, resize, pending)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Topology = Literal["nvlink", "leaf", "any", "auto"]  # auto: any placement, the scheduler's choice (it may
# wait a bounded time for a compact one: `locality_wait_s`); any: any placement, as soon as GPUs are free
PriorityClass = Literal["reserved", "on-demand", "spot"]
CLASS_RANK: dict[str, int] = {"reserved": 2, "on-demand": 1, "spot": 0}
FULL = 1000  # a whole GPU, in milli-GPUs
MIG_SLICES = 7  # compute slices of an A100/H100/B200-class GPU under MIG


def mig_milli(profile: str) -> int:
    """Share of one GPU a MIG profile takes, in milli-GPUs: `3g.40gb` → 3/7 of the GPU → 428."""
    head = profile.strip().lower().split(".", 1)[0]
    if not head.endswith("g") or not head[:-1].isdigit() or not 1 <= int(head[:-1]) <= MIG_SLICES:
        raise ValueError(f"not a MIG profile: {profile!r} (expected e.g. 1g.10gb, 3g.40gb, 7g.80gb)")
    return FULL * int(head[:-1]) // MIG_SLICES


@dataclass(frozen=True, slots=True)
class ModelHint:
    """Model size and precision, so placement can ask the performance model for step times."""

    preset: str | None = None
    params: float | None = None  # parameter count, when no preset
    precision: str = "bf16"


@dataclass(frozen=True, slots=True)
class Request:
    """A workload waiting for GPUs. `gpus` is the count asked for; elastic work gives [min_gpus, max_gpus]."""

    id: str
    gpus: int
    submit_time: float
    tenant: str = "default"
    gpu_type: str | tuple[str, ...] | None = None  # GPU model or node-group name(s), in preference order; None = any
    milli: int = FULL  # < FULL: a shared slice of one GPU
    min_gpus: int | None = None
    max_gpus: int | None = None
    topology: Topology = "auto"
    exclusive: bool = False  # whole nodes only
    nodes: int | None = None  # exactly this many nodes, the same number of GPUs on each (None: any)
    priority: PriorityClass = "on-demand"
    est_runtime: float | None = None  # declared or estimated seconds on a compact placement
    est_samples: tuple[float, ...] = ()  # sorted run times of similar finished work (the tenant's history), if known
    attained: float = 0.0  # GPU-seconds already received (LAS)
    model: ModelHint | None = None
    queued_since: float | None = None  # when it last joined the queue (a preemption or failure puts it back); None:
    # at submit_time. Starvation is waiting since then: work that was preempted has had service.
    cpu_milli: int = 0  # host CPU (1000 = one core) and memory for `gpus` GPUs, taken per GPU from the nodes its
    memory_mib: int = 0  # GPUs are on; counted only where the state tracks the nodes' hosts

    @property
    def waiting_since(self) -> float:
        return self.submit_time if self.queued_since is None else self.queued_since

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"{self.id}: gpus must be >= 0")
        if not 0 < self.milli <= FULL:
            raise ValueError(f"{self.id}: milli must be in 1..{FULL}")
        if self.milli < FULL and self.gpus != 1:
            raise ValueError(f"{self.id}: a GPU slice must ask for exactly one GPU")
        if (
            self.min_gpus is not None
            and self.max_gpus is not None
            and not (1 <= self.min_gpus <= self.gpus <= self.max_gpus)
        ):
            raise ValueError(f"{self.id}: elastic range must satisfy 1 <= min <= gpus <= max")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"{self.id}: cpu_milli and memory_mib must be >= 0")
        if self.nodes is not None and (self.nodes < 1 or self.milli < FULL):
            raise ValueError(f"{self.id}: nodes must be >= 1, and a GPU slice takes no nodes")

    @property
    def elastic(self) -> bool:
        return self.min_gpus is not None and self.max_gpus is not None and self.min_gpus < self.max_gpus

    @property
    def rank(self) -> int:
        return CLASS_RANK[self.priority]


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs held by a running workload."""

    id: str
    request: Request
    gpus: tuple[int, ...]
    start_time: float
    milli: int = FULL
    est_end: float | None = None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True, slots=True)
class Place:
    request_id: str
    gpus: tuple[int, ...]
    milli: int = FULL
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Preempt:
    allocation_id: str
    reason: str
    by: str = ""  # the request it makes room for (the control plane names it only to its own org)


@dataclass(frozen=True, slots=True)
class Resize:
    allocation_id: str
    gpus: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Pending:
    request_id: str
    reason: str
    position: int


Decision = Place | Preempt | Resize | Pending


@dataclass(slots=True)
class CycleResult:
    placed: list[Place] = field(default_factory=list)
    preempted: list[Preempt] = field(default_factory=list)
    resized: list[Resize] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)

    def decisions(self) -> list[Decision]:
        return [*self.preempted, *self.resized, *self.placed, *self.pending]
