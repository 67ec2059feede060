"""Resizing running elastic work: what its owner asks (`suanli scale`), how the scheduling pass carries out a resize
(its own or the policy's), and how long a resized run lasts on the virtual executor.

A resize is carried out in one transaction: the old allocation closes and a new one opens at the new size at the same
instant (billing at the new size from that second, each allocation charged by the metering rule), the workload's
attempt is counted up, and the supervisor restarts its ranks on the new allocation (`Supervisor._restart`): it stops
the running attempt through its executor, and once that has exited launches the new attempt with
`SUANLI_RESTART_REASON=resize`. A restart is neither a failure nor a retry, and the workload keeps its place.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from suanli.billing.money import ZERO
from suanli.control.accounts import memberships, spend_limits
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Conflict, Invalid, ServiceError
from suanli.control.money import metering, prices
from suanli.control.scheduling import inventory, placing
from suanli.control.scheduling.clock import seconds
from suanli.control.workloads import workloads
from suanli.db.engine import Database
from suanli.db.models import Allocation, Workload
from suanli.sched import ClusterState, Request, Resize, Scheduler, host_share
from suanli.sched.scaling import ScalingModel
from suanli.sim.runtime import RuntimeModel
from suanli.topology import Cluster
from suanli.workloads.runtime import predicted_runtime
from suanli.workloads.spec import WorkloadSpec

if TYPE_CHECKING:
    from suanli.control.scheduling.snapshot import ClusterView

HOLDING = ("scheduled", "starting", "running")  # states that hold an allocation: what may be scaled
OWNER = "as its owner asked"


# ---- what the owner asks ---------------------------------------------------------------------------------------
def scale(s: Session, who: Principal, ref: str, gpus: int, now: datetime) -> Workload:
    """Record that running elastic work should run on `gpus` GPUs; the next scheduling pass carries it out. 409 for
    work that is not elastic or holds no GPUs now; 422 naming `gpus` outside the spec's range."""
    w = workloads.get(s, who, ref, lock=True)
    memberships.check_work(s, who, w, "scale")
    spec = workloads.spec_of(w)
    lo_hi = spec.gpu_range()
    if lo_hi is None or lo_hi[0] == lo_hi[1]:
        raise Conflict(f"workload {w.id} is not elastic (resources.gpus: {spec.gpu_count()}); only work that asks for "
                       "{min, max} GPUs can be scaled")  # fmt: skip
    if w.state not in HOLDING or w.stop_requested:
        what = "stopping" if w.stop_requested and w.state in HOLDING else w.state
        raise Conflict(f"workload {w.id} is {what}; only running work can be scaled")
    lo, hi = lo_hi
    if not lo <= gpus <= hi:
        raise Invalid(f"gpus: must be within the spec's elastic range {lo}-{hi}; got {gpus}")
    nodes = spec.resources.nodes
    if nodes and gpus % nodes:
        raise Invalid(f"gpus: must be divisible by resources.nodes ({nodes}); got {gpus}")
    over = _over_ceiling(s, w, spec, gpus)
    if over is not None:
        raise Conflict(over)
    w.scale_to = gpus
    workloads.event(s, w, f"scale to {gpus} GPUs asked by {who.email}", now)
    inventory.bump_version(s)  # the scheduling pass looks again at once
    return w


def _over_ceiling(s: Session, w: Workload, spec: WorkloadSpec, gpus: int) -> str | None:
    """Why growing to `gpus` GPUs would cost more than the spec's `max_price_per_hour` at the prices in force, or
    None: its allocation's GPU model and billing, its host CPU and memory as one node-rank (the least a placement
    holds). The pass checks the placement it finds again (`carry_out`)."""
    a = s.get(Allocation, w.allocation_id) if spec.max_price_per_hour is not None and w.allocation_id else None
    if a is None or a.gpu_model is None or gpus <= a.gpus:
        return None
    _, book = prices.current(s)
    cpu, mem = spec.host_held([gpus])
    plan = a.billing_mode.startswith("plan")
    try:
        rate = ZERO if plan else book.rate(a.gpu_model, gpus, a.billing_mode, a.milli)  # type: ignore[arg-type]
    except (KeyError, ValueError):
        return None  # no longer priced: the pass refuses it, saying so
    host = book.host_rate(cpu, mem, "spot" if a.billing_mode == "spot" else "on-demand")
    row = {"gpus": gpus, "gpu_model": a.gpu_model, "cpu_milli": cpu, "memory_mib": mem, "rate_per_hour": rate + host}
    return placing.price_refusal(spec, row)


def pinned(req: Request, gpus: int) -> Request:
    """The scheduler's view of work held at `gpus` GPUs: rigid (the cycle neither grows nor shrinks it), its CPU and
    memory its ask's share per GPU."""
    return replace(req, gpus=gpus, min_gpus=None, max_gpus=None, cpu_milli=host_share(req.cpu_milli, gpus, req.gpus),
                   memory_mib=host_share(req.memory_mib, gpus, req.gpus))  # fmt: skip


def asked(s: Session) -> list[tuple[str, int, str]]:
    """(workload, GPUs its owner asked for, its allocation) of work holding GPUs that its owner scaled."""
    w = Workload
    rows = s.execute(
        select(w.id, w.scale_to, w.allocation_id)
        .where(w.scale_to.is_not(None), w.state.in_(HOLDING), w.allocation_id.is_not(None))
    )  # fmt: skip
    return [(wid, int(n), aid) for wid, n, aid in rows]


# ---- how long a run lasts on the virtual executor ------------------------------------------------------------------
@dataclass
class RunLengths:
    """How long a whole run of a workload lasts on some GPUs, as `suanli sim` would run it: the perf model's
    prediction when the spec names a model and tokens but no duration; elastic work's `duration` (measured at its
    minimum on a compact placement) scaled by the GPUs it holds (`sched.scaling`) and their placement (`sim.runtime`);
    None (the spec's duration, or until stopped) otherwise. Models cached per topology."""

    _models: dict[int, tuple[Cluster, ScalingModel, RuntimeModel]] = field(default_factory=dict)

    def __call__(self, spec: WorkloadSpec, cluster: Cluster, gpus: Sequence[int]) -> float | None:
        if not gpus:
            return None
        if spec.duration is None:
            return predicted_runtime(spec, cluster, gpus)
        lo_hi = spec.gpu_range()
        if lo_hi is None or lo_hi[0] == lo_hi[1]:
            return None
        hit = self._models.get(id(cluster))
        if hit is None or hit[0] is not cluster:
            hit = (cluster, ScalingModel(cluster), RuntimeModel(cluster))
            self._models[id(cluster)] = hit
        _, scaling, runtime = hit
        preset = spec.model.preset if spec.model else None
        speed = scaling.speedup(len(gpus), spec.gpu_count(), preset)
        slow = runtime.slowdown(np.asarray(sorted(gpus), dtype=np.int64), preset)
        return float(spec.duration * slow / speed) if speed > 0 else None


def rest_of_run(handle: dict[str, Any], stopped_at: float, spec: WorkloadSpec, penalty_s: float,
                length: float | None) -> float | None:  # fmt: skip
    """Seconds a virtual run restarted by a resize still lasts on its new GPUs (a whole run there takes `length`):
    the work it had left when stopped, plus `penalty_s` of work redone (`suanli sim`'s `resize_penalty_s`, counted
    in seconds at the spec's own size), at the new GPUs' speed. None: it runs until stopped."""
    run_s = handle.get("duration_s")
    if run_s is None or length is None:
        return None
    old = float(handle.get("length_s") or run_s)
    left = max(0.0, float(handle["start"]) + float(run_s) - stopped_at)
    ref = float(spec.duration) if spec.duration is not None else old
    redo = min(penalty_s, ref) / ref if ref > 0 else 0.0
    return (left / old + redo) * length if old > 0 else redo * length


def end_early(s: Session, allocation_id: str, end: datetime, now: datetime) -> None:
    """A run that ended on its own before a resize was decided: its allocation stops when it ended, not at the
    resize; what metering charged beyond that is given back (`metering.stop_earlier`)."""
    metering.stop_earlier(s, allocation_id, end, now)


# ---- carrying resizes out (the scheduling pass) -------------------------------------------------------------------
@dataclass(frozen=True)
class ResizeItem:
    """A resize the pass decided: the workload, its cluster, its new GPUs (by node name, and as the topology's
    indices), the GPUs it held in the snapshot, and why (the policy's verb, or its owner's ask)."""

    workload: str
    view: ClusterView
    placement: dict[str, list[int]]
    gpus: tuple[int, ...]
    held: tuple[int, ...]
    verb: str


def carry_out(
    s: Session, items: list[ResizeItem], now: datetime, *, hold_minutes: int, cache: dict[str, WorkloadSpec],
    lengths: Callable[[WorkloadSpec, Cluster, Sequence[int]], float | None],
) -> tuple[int, dict[str, str]]:  # fmt: skip
    """Close each resized workload's allocation and open the new one at the same instant, in the caller's transaction.
    A grow is admitted like a placement (balance hold, quotas, a plan's GPUs, the spec's price ceiling), counting the
    allocation it replaces as gone: the policy's grows as far as is admitted, an owner's all or nothing; a shrink
    always is (it needs less). Returns how many were carried out and, by workload, why a grow was refused. Work that
    changed since the snapshot (ended, placed elsewhere, a virtual run already over) is left."""
    _, book = prices.current(s)
    loads: dict[str, metering.OrgLoad] = {}
    plan_use: dict[str, int] = {}
    spending: dict[tuple[str, str], spend_limits.Spending | None] = {}
    done, refused = 0, {}
    for it in items:
        w = s.get(Workload, it.workload, with_for_update=True, populate_existing=True)
        if w is None or w.state not in HOLDING or w.allocation_id is None:
            continue
        old = s.get(Allocation, w.allocation_id, with_for_update=True, populate_existing=True)
        if old is None or old.stopped_at is not None or sorted(_global(it.view, old.placement)) != sorted(it.held):
            continue
        if w.executor == "virtual" and w.state == "running" and w.ends_at is not None and w.ends_at <= now:
            continue  # its run is over; the supervisor records that now
        spec = cache.get(w.id) or WorkloadSpec.model_validate(w.spec)
        n = len(it.gpus)
        grow = n > old.gpus
        if grow and w.stop_requested:  # ending: as `scale` refuses it, the policy grows it no more
            continue
        if w.org_id not in loads:
            loads[w.org_id] = metering.org_load(s, w.org_id)
        load = loads[w.org_id]
        before = (load.rate, load.gpus, load.cpu_milli, load.memory_mib)
        load.rate, load.gpus = load.rate - old.rate_per_hour, load.gpus - old.gpus  # it leaves as the new one opens
        load.cpu_milli, load.memory_mib = load.cpu_milli - old.cpu_milli, load.memory_mib - old.memory_mib
        plan = spec.plan_id()
        topo = it.view.topology
        assert topo is not None
        # The policy's grow past what the org may hold or afford grows as far as is admitted (keeping the GPUs it
        # holds first), as a placement does; a size its owner asked for is all or nothing.
        partial = grow and it.verb != OWNER and spec.resources.nodes is None
        order = [g for g in it.gpus if g in it.held] + [g for g in it.gpus if g not in it.held]
        row, refusal, gpus, where = None, "", it.gpus, it.placement
        for k in range(n, old.gpus if partial else n - 1, -1):
            gpus = it.gpus if k == n else tuple(sorted(order[:k]))
            where = it.placement if k == n else by_node(it.view, gpus)
            try:
                if plan is not None and grow:
                    why = placing.plan_refusal(s, plan, k - old.gpus, now, plan_use)
                    if why is not None:
                        raise Conflict(why)
                model = topo.group_of(it.view.index[next(iter(where))]).gpu.name
                cpu, mem = spec.host_held(len(g) for g in where.values())
                row = metering.admitted_row(
                    s, org_id=w.org_id, user_id=w.user_id, workload=w.id, gpu_model=model, gpus=k, placement=where,
                    now=now, hold_minutes=hold_minutes, milli=old.milli, mode=old.billing_mode,
                    allocation_id=f"{w.id}.{w.attempt + 1}", rate=ZERO if plan else None, load=load, book=book,
                    cpu_milli=cpu, memory_mib=mem, check=grow,
                )  # fmt: skip
                ceiling = placing.price_refusal(spec, row) if grow else None  # a shrink is never refused
                if ceiling is not None:  # grown at the prices in force, as far as the spec's ceiling
                    placing.unadmit(load, row)
                    row = None
                    raise Conflict(ceiling)
                if grow and not memberships.may_spend(s, w.org_id, w.user_id):
                    placing.unadmit(load, row)
                    row = None
                    raise Conflict(f"not grown: {memberships.LOST_SPEND}")
                member = placing.member_spending(s, spending, load, w.user_id, now) if grow else None
                more = row["rate_per_hour"] - old.rate_per_hour
                over = member.admit(more, hold_minutes) if member is not None and more > 0 else None
                if over is not None:  # a grow spends more of the org's money: within the member's limit
                    placing.unadmit(load, row)
                    row = None
                    raise Conflict(over)
                break
            except ServiceError as e:
                refusal = refusal or e.message
        if row is None:
            load.rate, load.gpus, load.cpu_milli, load.memory_mib = before
            refused[w.id] = refusal
            continue
        verb = it.verb if len(gpus) == n else f"{it.verb} ({len(gpus)} of {n} GPUs admitted: {refusal})"
        n = len(gpus)
        if plan is not None:
            plan_use[plan] = plan_use.get(plan, 0) + n - old.gpus
        # On a whole second of the old allocation: every second is then billed once, the last ones at the new size.
        whole = math.floor(max(0.0, (now - old.started_at).total_seconds()) + 1e-6)
        closed = metering.close_allocation(s, old.id, old.started_at + timedelta(seconds=whole))
        assert closed.stopped_at is not None
        row["started_at"] = closed.stopped_at  # the same instant: no second unbilled, none billed twice
        s.execute(insert(Allocation.__table__), [row])
        held_s = max(0.0, (closed.stopped_at - old.started_at).total_seconds())
        w.attained_gpu_s += held_s * old.gpus * old.milli / 1000
        if w.handle is not None:  # the running attempt, and when it was resized: a run that ended before that is over
            w.handle = {"attempt": w.attempt, **w.handle, "resized_at": seconds(now)}
        w.attempt, w.allocation_id = w.attempt + 1, row["id"]
        w.predicted_s = lengths(spec, topo, gpus)
        if w.executor == "virtual" and w.state == "running":
            w.ends_at = now  # the supervisor restarts it this pass
        workloads.event(s, w, f"resized from {old.gpus} to {n} GPUs: {verb}", now)
        done += 1
    return done, refused


@dataclass
class Resizer:
    """What the scheduling pass keeps about running elastic work between passes: which of it the policy may resize
    (by cluster: work its owner scaled is held at that size), each one's own request, and the refusals its events
    already say."""

    elastic: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    asked: dict[str, Request] = field(default_factory=dict)  # sched id -> an elastic workload's own request
    noted: dict[str, str] = field(default_factory=dict)  # workload -> the last resize refusal its events say
    lengths: RunLengths = field(default_factory=RunLengths)

    def reset(self) -> None:
        self.elastic.clear()
        self.asked.clear()

    def forget(self, cid: str, sched_id: str) -> None:
        self.elastic[cid].discard(sched_id)
        self.asked.pop(sched_id, None)

    def any_elastic(self) -> bool:
        return any(self.elastic.values())

    def pin(self, states: dict[str, ClusterState], held: dict[str, tuple[str, str]],
            asks: list[tuple[str, int, str]]) -> dict[str, list[tuple[str, int]]]:  # fmt: skip
        """Work its owner scaled is held at a size from now on: rigid in the snapshot (the cycle neither grows nor
        shrinks it). Returns the asks by cluster: (workload, GPUs)."""
        out: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for _, n, aid in asks:
            if aid not in held:
                continue
            cid, sched_id = held[aid]
            a = states[cid].allocations.get(sched_id)
            if a is None:
                continue
            if a.request.elastic:
                states[cid].unreserve(sched_id)
                states[cid].reserve(replace(a, request=pinned(a.request, a.gpu_count)), restore=True)
                self.elastic[cid].discard(sched_id)
            out[cid].append((sched_id, n))
        return out

    def scale(self, scheduler: Scheduler, view: ClusterView, state: ClusterState, asks: list[tuple[str, int]],
              resizes: list[ResizeItem], waits: dict[str, str]) -> ClusterState:  # fmt: skip
        """The sizes owners asked for, decided on copies of the snapshot; the state the cycle then runs on."""
        for wid, n in asks:
            a = state.allocations.get(wid)
            if a is None or a.gpu_count == n:
                continue
            own = self.asked.get(wid)
            req = pinned(own, n) if own is not None else replace(a.request, gpus=n)
            decision, state = scheduler.resize(state, wid, n, OWNER, req)
            if isinstance(decision, Resize):
                resizes.append(ResizeItem(wid, view, by_node(view, decision.gpus), decision.gpus, a.gpus, OWNER))
            else:
                waits[wid] = f"scale to {n} GPUs waits: {decision.reason}"
        return state

    def growable(self, scheduler: Scheduler, cid: str, state: ClusterState) -> bool:
        """Whether the policy might grow running elastic work here: some is below its maximum and GPUs are idle."""
        if not scheduler.policy.elastic or state.free_whole_gpus() == 0:
            return False
        mine = (state.allocations.get(x) for x in self.elastic.get(cid, ()))
        return any(a is not None and a.gpu_count < (a.request.max_gpus or 0) for a in mine)

    def persist(self, db: Database, now: datetime, resizes: list[ResizeItem], waits: dict[str, str],
                hold_minutes: int, cache: dict[str, WorkloadSpec]) -> int:  # fmt: skip
        """Carry the pass's resizes out in one transaction; a grow refused (its org cannot afford or hold it) and a
        size its owner asked for that waits are said once in the workload's events. Returns how many were done."""
        with db.write() as s, s.begin():
            done, refused = carry_out(s, resizes, now, hold_minutes=hold_minutes, cache=cache, lengths=self.lengths)
            for rz in resizes:
                if rz.workload not in refused:
                    self.noted.pop(rz.workload, None)
            for wid, why in {**waits, **{k: f"not resized: {v}" for k, v in refused.items()}}.items():
                if self.noted.get(wid) != why:
                    self.noted[wid] = why
                    note(s, wid, why, now)
        return done


def item(view: ClusterView, rz: Resize, state: ClusterState) -> ResizeItem:
    """The policy's resize decision (`Scheduler.cycle`), against the snapshot it was decided on."""
    return ResizeItem(rz.allocation_id, view, by_node(view, rz.gpus), rz.gpus, state.allocations[rz.allocation_id].gpus,
                      rz.reason.split(":")[0])  # fmt: skip


def by_node(view: ClusterView, gpus: Sequence[int]) -> dict[str, list[int]]:
    """The topology's GPU indices as a placement: node name -> GPU indices on that node."""
    assert view.topology is not None
    out: dict[str, list[int]] = {}
    for g in sorted(gpus):
        i = view.node_of(g)
        out.setdefault(view.nodes[i][0], []).append(g - view.topology.gpus_of_node(i).start)
    return out


def note(s: Session, workload_id: str, reason: str, now: datetime) -> None:
    """An event on a workload that may have changed since the pass read it (it is said in its current state)."""
    w = s.get(Workload, workload_id)
    if w is not None and w.state in HOLDING:
        workloads.event(s, w, reason, now)


def _global(view: ClusterView, placement: dict[str, list[int]]) -> list[int]:
    assert view.topology is not None
    out: list[int] = []
    for node, gpus in (placement or {}).items():
        if node not in view.index:
            return []
        base = view.topology.gpus_of_node(view.index[node]).start
        out += [base + int(g) for g in gpus]
    return out
