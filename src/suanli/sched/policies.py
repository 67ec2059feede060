"""Queue policies as named combinations of plugins: queue-sort, placement, backfill, preemption, elastic.

| policy | queue order | placement | when the head is blocked | preemption |
|---|---|---|---|---|
| fifo | submit time | first-fit | everything behind it waits | none |
| fifo-backfill | submit time | topology | EASY: later jobs start if they do not delay the head's reservation | none |
| priority | class, then submit | topology | EASY | spot work, for higher classes |
| fair-share | below-quota tenants first, then weighted DRF share | topology | greedy | borrowed (over-quota) work, for tenants below quota |
| las | 2D-LAS level (attained GPU-time), then submit | first-fit | greedy | higher LAS levels (Tiresias) |
| elastic | class, LAS level, submit | topology | greedy, shrinking grown elastic jobs | spot work |
| srsf | class, estimated service left (`sched/estimates.py`), submit | topology | as default | spot work, and work with `preempt_gain` x the request's estimated service left |
| las-srsf | class, LAS level, estimated service left, submit | topology | as default | as default |
| default | class, LAS level, submit | topology | greedy, with an EASY reservation for work waiting over `starvation_s` since it last joined the queue; elastic jobs grow by goodput | spot work, and higher LAS levels (bounded collateral) |

Why this default (measured in `benchmarks/sched_quality.py`, see docs/scheduling.md): LAS ordering with
preemption gives short jobs a fast start without knowing durations (Tiresias); topology-aware placement
keeps gangs compact, so they run at full speed instead of paying for scattered collectives; greedy
backfill keeps GPUs busy whenever anything fits; preempting the smallest victims first, and never more
than `preempt_collateral` GPUs per GPU needed (spot work taken by a higher class is not counted: spot work exists
to be preempted), stops a 1-GPU job from evicting a 64-GPU gang (the failure
mode that makes plain LAS slow on Philly); elastic jobs grow into idle GPUs while the perf model says the
extra GPUs pay, and shrink back first when work waits and can start on what they give back (Pollux's jobs finish
3-4x sooner).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from suanli.sched import gittins
from suanli.sched.state import ClusterState
from suanli.sched.types import FULL, Allocation, Request

Backfill = Literal["none", "easy", "greedy"]
PreemptRule = Callable[[Allocation, Request, "PolicyContext"], bool]
SortKey = Callable[[Request, "PolicyContext"], tuple]


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "default"
    placement: str | None = None  # override the policy's placement plugin
    backfill_depth: int = 256  # how far down the queue one cycle looks once the head is blocked
    las_thresholds: tuple[float, ...] = (3_600.0, 36_000.0, 360_000.0)  # GPU-seconds between LAS levels
    starvation_s: float = 48 * 3_600.0  # default policy: reserve for work waiting this long since (re)queued
    min_runtime_s: float = 600.0  # no LAS preemption of work that started less than this ago
    quotas: Mapping[str, float] = field(default_factory=dict)  # tenant → guaranteed GPUs
    weights: Mapping[str, float] = field(default_factory=dict)  # tenant → fair-share weight (default 1)
    max_victims: int = 64  # victims one preemption statement may consider
    max_preemption_attempts: int = 8  # blocked requests per cycle that may try preemption
    las_newer_only: bool = False  # LAS preemption only for work that joined the queue after the victim started
    las_size_order: bool = False  # `default`, `elastic`: within a class and LAS level, fewer GPUs first (2D-LAS: at
    # equal attained time the smaller gang has the least expected service left)
    elastic_shrink: bool = False  # a blocked request first shrinks elastic work it may preempt (toward its minimum
    # for a smaller gang, its ask for one as large; most attained service first) instead of evicting it: a resize, not
    # a restart, and only the GPUs it needs
    gittins: bool = False  # `default`, `elastic`, `las`: within a class, order the queue by the Gittins index of each
    # job's run time (`sched/gittins.py`, from its similar work's samples; its LAS level where it has none) instead of
    # LAS level then submit time. Preemption is unchanged (LAS levels).
    grow_las: bool = False  # elastic jobs grow into idle GPUs least attained service first (LAS level, then oldest)
    # instead of oldest first
    preempt_gain: float = 2.0  # srsf: evict only work with this many times the request's estimated service left
    locality_wait_s: float = 0.0  # a gang one node could hold waits up to this long (since it joined the queue) for
    # one node rather than start split over several (delay scheduling); 0: never waits
    preempt_collateral: float = 2.0  # a preemption may evict at most this many GPUs per GPU it needs (spot work
    # taken by a higher class not counted)


@dataclass
class PolicyContext:
    config: SchedulerConfig
    now: float
    state: ClusterState
    tenant_gpus: dict[str, float]

    def las_level(self, attained: float) -> int:
        return bisect_right(self.config.las_thresholds, attained)

    def share(self, tenant: str) -> float:
        weight = self.config.weights.get(tenant, 1.0)
        if weight <= 0:
            return float("inf")  # a zero weight is served last
        return self.tenant_gpus.get(tenant, 0.0) / (weight * max(1, self.state.n_gpus))

    def below_quota(self, tenant: str) -> bool:
        return self.tenant_gpus.get(tenant, 0.0) < self.config.quotas.get(tenant, 0.0)


# ---- queue-sort plugins -------------------------------------------------------------------------------
def by_submit(r: Request, ctx: PolicyContext) -> tuple:
    return (r.submit_time, r.id)


def by_class(r: Request, ctx: PolicyContext) -> tuple:
    return (-r.rank, r.submit_time, r.id)


def by_las(r: Request, ctx: PolicyContext) -> tuple:
    if ctx.config.gittins:
        return (-gittins_rate(r, r.attained, ctx), r.submit_time, r.id)
    return (ctx.las_level(r.attained), r.submit_time, r.id)


def gittins_rate(r: Request, attained: float, ctx: PolicyContext) -> float:
    """Completions per GPU-second of further service the job promises (`sched/gittins.py`): its run time's Gittins
    index over its similar work's samples, per GPU. With no samples, its LAS level stands in: one over the level's
    upper bound in GPU-seconds (levels are what keep LAS from preempting back and forth over small differences); the
    last level has none, and ranks as ten times the last threshold."""
    g = max(1e-9, r.gpus * r.milli / FULL)
    if not r.est_samples:
        bounds = ctx.config.las_thresholds
        level = ctx.las_level(attained)
        return 1.0 / (bounds[level] if level < len(bounds) else 10 * bounds[-1]) if bounds else 0.0
    return gittins.index(r.est_samples, attained / g) / g


def by_class_las(r: Request, ctx: PolicyContext) -> tuple:
    if ctx.config.gittins:
        return (-r.rank, -gittins_rate(r, r.attained, ctx), r.submit_time, r.id)
    if ctx.config.las_size_order:  # a g-GPU job's Gittins index at equal attained time is 1/g of a 1-GPU job's
        return (-r.rank, ctx.las_level(r.attained), r.gpus * r.milli, r.submit_time, r.id)
    return (-r.rank, ctx.las_level(r.attained), r.submit_time, r.id)


def served(a: Allocation, now: float) -> float:
    """GPU-seconds a running allocation has attained by `now`: before this run and during it."""
    return a.request.attained + (now - a.start_time) * a.gpu_count * a.milli / FULL


def est_left(r: Request, attained: float | None = None) -> float:
    """Estimated remaining service (GPU-seconds): estimate x GPUs less what it has had. Robust to bad estimates:
    work past its estimate is taken to need as much again as it has had (heavy tails: the longer a job has run, the
    longer it will run), never to be nearly done; with no estimate, its attained service (LAS)."""
    had = r.attained if attained is None else attained
    if r.est_samples:
        return r.gpus * r.milli / FULL * expected_left(r.est_samples, had * FULL / (max(1, r.gpus) * r.milli))
    if r.est_runtime is None:
        return had
    total = r.est_runtime * r.gpus * r.milli / FULL
    return total - had if had < total else had


def expected_left(samples: tuple[float, ...], ran: float) -> float:
    """E[D - ran | D > ran] over the sorted sample of run times D; `ran` when the job has outrun them all."""
    i = bisect_right(samples, ran)
    rest = samples[i:]
    if not rest:
        return ran
    return sum(rest) / len(rest) - ran


def by_class_est(r: Request, ctx: PolicyContext) -> tuple:
    return (-r.rank, est_left(r), r.submit_time, r.id)


def by_class_las_est(r: Request, ctx: PolicyContext) -> tuple:
    """LAS levels first (robust: a bad estimate moves work only within its level), then estimated service left."""
    return (-r.rank, ctx.las_level(r.attained), est_left(r), r.submit_time, r.id)


def by_fair_share(r: Request, ctx: PolicyContext) -> tuple:
    return (0 if ctx.below_quota(r.tenant) else 1, ctx.share(r.tenant), r.submit_time, r.id)


# ---- preemption rules (may `victim` be evicted for `req`?) ---------------------------------------------
def lower_class(victim: Allocation, req: Request, ctx: PolicyContext) -> bool:
    return victim.request.rank < req.rank


def higher_las_level(victim: Allocation, req: Request, ctx: PolicyContext) -> bool:
    if victim.request.rank > req.rank or ctx.now - victim.start_time < ctx.config.min_runtime_s:
        return False
    if ctx.config.las_newer_only and req.waiting_since < victim.start_time:
        return False  # it was waiting when the victim was chosen to start: nothing new to preempt for
    return ctx.las_level(served(victim, ctx.now)) > ctx.las_level(req.attained)


def more_left(victim: Allocation, req: Request, ctx: PolicyContext) -> bool:
    """Same class or lower, run `min_runtime_s`, and `preempt_gain` times the request's estimated service left:
    a preemption costs a restart, so it must win clearly."""
    if victim.request.rank > req.rank or ctx.now - victim.start_time < ctx.config.min_runtime_s:
        return False
    attained = victim.request.attained + (ctx.now - victim.start_time) * victim.gpu_count * victim.milli / FULL
    return est_left(victim.request, attained) > ctx.config.preempt_gain * est_left(req)


def lower_class_or_more_left(victim: Allocation, req: Request, ctx: PolicyContext) -> bool:
    return lower_class(victim, req, ctx) or more_left(victim, req, ctx)


def lower_class_or_las(victim: Allocation, req: Request, ctx: PolicyContext) -> bool:
    return lower_class(victim, req, ctx) or higher_las_level(victim, req, ctx)


def borrowed(victim: Allocation, req: Request, ctx: PolicyContext) -> bool:
    t = victim.request.tenant
    return (
        t != req.tenant
        and ctx.below_quota(req.tenant)
        and not ctx.below_quota(t)
        and (ctx.tenant_gpus.get(t, 0.0) > ctx.config.quotas.get(t, 0.0))
    )


@dataclass(frozen=True)
class Policy:
    name: str
    sort_key: SortKey
    placement: str
    backfill: Backfill
    preempt: PreemptRule | None = None
    elastic: bool = False
    starvation_guard: bool = False
    static_key: bool = True  # the queue order depends on the request alone (not on cluster state)
    class_preemption: bool = False  # it preempts lower classes' work: spot work then yields whatever its size


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("fifo", by_submit, "first-fit", "none"),
        Policy("fifo-backfill", by_submit, "topology", "easy"),
        Policy("priority", by_class, "topology", "easy", lower_class, class_preemption=True),
        Policy("fair-share", by_fair_share, "topology", "greedy", borrowed, static_key=False),
        Policy("las", by_las, "first-fit", "greedy", higher_las_level),
        Policy("elastic", by_class_las, "topology", "greedy", lower_class, elastic=True, class_preemption=True),
        Policy(
            "srsf",
            by_class_est,
            "topology",
            "greedy",
            lower_class_or_more_left,
            elastic=True,
            starvation_guard=True,
            class_preemption=True,
        ),
        Policy(
            "las-srsf",
            by_class_las_est,
            "topology",
            "greedy",
            lower_class_or_las,
            elastic=True,
            starvation_guard=True,
            class_preemption=True,
        ),
        Policy(
            "default",
            by_class_las,
            "topology",
            "greedy",
            lower_class_or_las,
            elastic=True,
            starvation_guard=True,
            class_preemption=True,
        ),
    )
}


def policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name]


KNOBS = ("gittins", "elastic_shrink", "grow_las", "las_newer_only", "las_size_order", "locality")  # switches, off by
# default, measured in docs/scheduling.md: SchedulerConfig's boolean fields of those names, and `locality`: a gang one
# node could hold waits for one node up to the starvation bound (`locality_wait_s` = `starvation_s`)


def configured(name: str) -> SchedulerConfig:
    """`policy[+knob...]` → its configuration: `default+gittins+elastic_shrink+grow_las` is the default policy with
    those switches on. The names `suanli sim --policy` and the server's `policy` setting take."""
    head, *knobs = [part.strip().lower() for part in name.split("+")]
    policy(head)  # unknown: a ValueError naming the known ones
    config = SchedulerConfig(policy=head)
    for knob in knobs:
        if knob not in KNOBS:
            raise ValueError(f"unknown switch {knob!r} in {name!r}; known: {', '.join(KNOBS)}")
        if knob == "locality":
            config = replace(config, locality_wait_s=config.starvation_s)
        else:
            config = replace(config, **{knob: True})
    return config


def config_name(config: SchedulerConfig) -> str:
    """The `policy[+knob...]` name of a configuration's policy and switches (knobs in `KNOBS` order)."""
    on = [k for k in KNOBS if (config.locality_wait_s > 0 if k == "locality" else getattr(config, k))]
    return "+".join([config.policy, *on])
