"""What a replay measured: job completion and queueing times, utilisation, waste, fragmentation, fairness."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from suanli.sched import ClusterState, Request
from suanli.sched.types import FULL


@dataclass
class JobRecord:
    job_id: str
    tenant: str
    submit: float
    duration: float  # on the reference placement
    gpus: int
    first_start: float | None = None
    finish: float | None = None
    preemptions: int = 0
    failures: int = 0
    resizes: int = 0
    unschedulable: bool = False
    slowdowns: list[float] = field(default_factory=list)

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.submit


@dataclass
class SimResult:
    jobs: int
    finished: int
    queued: int
    running: int
    unschedulable: int
    avg_jct_s: float
    p50_jct_s: float
    p95_jct_s: float
    p99_jct_s: float
    avg_queue_s: float
    makespan_s: float
    utilization: float  # allocated GPU-time / capacity over the makespan
    useful_utilization: float  # work done, in GPU-seconds of the reference placement, / capacity
    waste_fraction: float  # idle GPU-time while work was queued / GPU-time while work was queued
    fragmentation: float  # idle GPU-time no queued job could use / GPU-time while work was queued
    preemptions: int
    failures: int
    jain_fairness: float
    worst_tenant_slowdown: float
    avg_placement_slowdown: float
    decision_p50_ms: float
    decision_p99_ms: float
    replay_wall_s: float
    # where the GPU-time went (GPU-hours): allocated = work + slowdown + elastic + redone (preemption, failure, resize)
    work_gpu_h: float = 0.0  # recorded work done (trace durations x GPUs, as on the reference placement)
    slowdown_gpu_h: float = 0.0  # held GPU-time lost to placement slowdown (a split gang runs slower)
    elastic_gpu_h: float = 0.0  # held beyond the asked-for work rate by grown/shrunk elastic jobs (< 0: it paid)
    preemption_gpu_h: float = 0.0  # work redone after preemptions (lost progress + restart)
    failure_gpu_h: float = 0.0  # work redone after node failures
    resize_gpu_h: float = 0.0  # work redone after elastic resizes
    idle_queued_gpu_h: float = 0.0  # GPUs idle while work waited (the waste)
    requeued_gpu_h: float = 0.0  # GPUs asked for by jobs back in the queue after a preemption or failure, x time
    slowdown_by_size: dict[str, float] = field(default_factory=dict)  # slowdown GPU-hours per gang size bucket
    timeline: dict[str, list[float]] = field(default_factory=dict, repr=False)
    jct_samples: list[float] = field(default_factory=list, repr=False)

    def breakdown(self) -> dict[str, float]:
        """The GPU-time of the replay by where it went, in GPU-hours."""
        return {k: getattr(self, k) for k in BREAKDOWN}

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("timeline")
        out.pop("jct_samples")
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}


BREAKDOWN = ("work_gpu_h", "slowdown_gpu_h", "elastic_gpu_h", "preemption_gpu_h", "failure_gpu_h", "resize_gpu_h",
             "idle_queued_gpu_h", "requeued_gpu_h")  # fmt: skip
SIZE_BUCKETS = ((1, "1"), (2, "2"), (4, "3-4"), (8, "5-8"), (32, "9-32"), (1 << 30, "33+"))


def size_bucket(gpus: int) -> str:
    return next(name for top, name in SIZE_BUCKETS if gpus <= top)


class MetricsRecorder:
    """Integrates cluster-level quantities over simulated time."""

    TIMELINE_POINTS = 2_000

    def __init__(self, n_gpus: int) -> None:
        self.n_gpus = n_gpus
        self.t = 0.0
        self.alloc_gpu_s = 0.0
        self.useful_gpu_s = 0.0
        self.queued_gpu_s = 0.0  # capacity-seconds while the queue was non-empty
        self.waste_gpu_s = 0.0
        self.frag_gpu_s = 0.0
        self.frag_idle = 0  # idle GPUs no queued job can use, as of the last cycle
        self.failures = 0
        self.decision_times: list[float] = []
        self.timeline: dict[str, list[float]] = {"t": [], "allocated": [], "queue": []}
        self._last_sample = -1.0
        self.work_gpu_s = 0.0  # set by the simulation at the end: recorded work done
        self.slow_gpu_s: dict[str, float] = {}
        self.elastic_gpu_s = 0.0
        self.redo_gpu_s = {"preemption": 0.0, "failure": 0.0, "resize": 0.0}
        self.requeued_gpu_s = 0.0
        self.requeued_now = 0.0  # GPUs asked for by queued jobs that were stopped (kept by the simulation)

    def redone(self, req: Request, seconds: float, why: str) -> None:
        """A stop or resize adds `seconds` of reference work to a job: lost progress and restart."""
        self.redo_gpu_s[why] += seconds * req.gpus * req.milli / FULL

    def interval(self, dt: float, state: ClusterState, queue: dict, running: dict, requests: list[Request]) -> None:
        allocated = state.allocated_gpus()
        useful = 0.0  # reference GPU-s/s
        for i, r in running.items():
            req = requests[i]
            share = req.milli / FULL
            rate = req.gpus * share * r.rate
            useful += rate
            held = r.gpus.size * share * dt
            lost = held * (1.0 - 1.0 / r.slow)
            if lost > 0:
                b = size_bucket(req.gpus)
                self.slow_gpu_s[b] = self.slow_gpu_s.get(b, 0.0) + lost
            self.elastic_gpu_s += held / r.slow - rate * dt
        self.alloc_gpu_s += allocated * dt
        self.useful_gpu_s += min(useful, allocated) * dt
        self.requeued_gpu_s += self.requeued_now * dt
        if queue:
            idle = state.idle_gpus()
            self.queued_gpu_s += self.n_gpus * dt
            self.waste_gpu_s += idle * dt
            self.frag_gpu_s += min(self.frag_idle, idle) * dt
        self.t += dt
        self._sample(allocated, len(queue))

    def _sample(self, allocated: float, queue_len: int) -> None:
        if self.t - self._last_sample >= 60.0 or not self.timeline["t"]:
            self.timeline["t"].append(self.t)
            self.timeline["allocated"].append(allocated)
            self.timeline["queue"].append(float(queue_len))
            self._last_sample = self.t

    def after_cycle(self, state: ClusterState, queue: dict[int, Request]) -> None:
        idle = state.idle_gpus()
        if not queue or idle == 0:
            self.frag_idle = 0
            return
        smallest = min(r.gpus for r in queue.values())
        self.frag_idle = idle if smallest > idle else 0

    def result(self, records: list[JobRecord], end: float, wall: float, queued: int, running: int) -> SimResult:
        done = [r for r in records if r.finish is not None]
        jct = np.array([r.jct for r in done], dtype=float) if done else np.zeros(1)
        waits = np.array([r.first_start - r.submit for r in records if r.first_start is not None] or [0.0])
        first_submit = min((r.submit for r in records), default=0.0)
        makespan = max(end - first_submit, 1e-9)
        capacity = self.n_gpus * makespan
        dec = np.array(self.decision_times or [0.0]) * 1e3
        tenants: dict[str, list[float]] = {}
        for r in done:
            tenants.setdefault(r.tenant, []).append(max(r.jct or 0.0, 1e-9) / max(r.duration, 1e-9))
        per_tenant = np.array([float(np.mean(v)) for v in tenants.values()] or [1.0])
        x = 1.0 / per_tenant
        jain = float(x.sum() ** 2 / (x.size * (x**2).sum()))
        slow = [s for r in done for s in r.slowdowns]
        return SimResult(
            jobs=len(records),
            finished=len(done),
            queued=queued,
            running=running,
            unschedulable=sum(r.unschedulable for r in records),
            avg_jct_s=float(jct.mean()),
            p50_jct_s=float(np.percentile(jct, 50)),
            p95_jct_s=float(np.percentile(jct, 95)),
            p99_jct_s=float(np.percentile(jct, 99)),
            avg_queue_s=float(waits.mean()),
            makespan_s=makespan,
            utilization=self.alloc_gpu_s / capacity,
            useful_utilization=self.useful_gpu_s / capacity,
            waste_fraction=self.waste_gpu_s / self.queued_gpu_s if self.queued_gpu_s else 0.0,
            fragmentation=self.frag_gpu_s / self.queued_gpu_s if self.queued_gpu_s else 0.0,
            preemptions=sum(r.preemptions for r in records),
            failures=self.failures,
            jain_fairness=jain,
            worst_tenant_slowdown=float(per_tenant.max()),
            avg_placement_slowdown=float(np.mean(slow)) if slow else 1.0,
            decision_p50_ms=float(np.percentile(dec, 50)),
            decision_p99_ms=float(np.percentile(dec, 99)),
            replay_wall_s=wall,
            work_gpu_h=self.work_gpu_s / 3600,
            slowdown_gpu_h=sum(self.slow_gpu_s.values()) / 3600,
            elastic_gpu_h=self.elastic_gpu_s / 3600,
            preemption_gpu_h=self.redo_gpu_s["preemption"] / 3600,
            failure_gpu_h=self.redo_gpu_s["failure"] / 3600,
            resize_gpu_h=self.redo_gpu_s["resize"] / 3600,
            idle_queued_gpu_h=self.waste_gpu_s / 3600,
            requeued_gpu_h=self.requeued_gpu_s / 3600,
            slowdown_by_size={
                b: v / 3600 for b, _ in ((n, 0) for _, n in SIZE_BUCKETS) if (v := self.slow_gpu_s.get(b, 0.0))
            },
            timeline=self.timeline,
            jct_samples=[float(v) for v in jct] if done else [],
        )
