"""One scheduling cycle: snapshot + queue → decisions (place, preempt, resize, pending with a reason).

Kubernetes scheduling-framework shape: the policy's queue-sort orders the queue; for each request the
placement plugin filters and scores GPUs on a working copy of the snapshot; a successful placement is
reserved; a blocked one may try preemption inside a *statement* — victims are unreserved on a scratch
copy, and the statement commits only if the whole gang then fits (all-or-nothing permit), otherwise it is
discarded. EASY backfill keeps a reservation for the first blocked request. The cycle never mutates its
input state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from suanli.sched import holds
from suanli.sched.elastic import Elastic
from suanli.sched.placement import PLACEMENTS, PlacementResult, Placer
from suanli.sched.policies import Policy, PolicyContext, SchedulerConfig, policy
from suanli.sched.scaling import ScalingModel
from suanli.sched.state import ClusterState
from suanli.sched.types import FULL, Allocation, CycleResult, Pending, Place, Preempt, Request


@dataclass
class _Reservation:
    request: Request
    shadow_time: float  # when enough GPUs free up for the blocked head
    extra: int  # GPUs free at shadow_time beyond what the head needs


_SCRATCH = "\0placing:"  # no real allocation id starts with a NUL


def _alloc_id(req: Request) -> str:
    return req.id


def _yields(victim: Allocation, req: Request) -> bool:
    """Spot work gives way to work of a higher class whatever its size (under a policy that preempts by class): no
    collateral bound protects it."""
    return victim.request.priority == "spot" and victim.request.rank < req.rank


class Scheduler(Elastic):
    """Runs the configured policy. Pure: time is passed in, state is copied."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.policy: Policy = policy(self.config.policy)
        name = self.config.placement or self.policy.placement
        if name not in PLACEMENTS:
            raise ValueError(f"unknown placement {name!r}; known: {', '.join(PLACEMENTS)}")
        self.placer: Placer = PLACEMENTS[name]
        self._key_memo: dict[int, tuple[Request, tuple]] = {}
        self._scaling_models: dict[int, ScalingModel] = {}
        self._now = 0.0  # the time of the cycle running

    # ---- the cycle ------------------------------------------------------------------------------
    def cycle(
        self, snapshot: ClusterState, queue: Sequence[Request], now: float, explain: bool = True
    ) -> tuple[CycleResult, ClusterState]:
        """Decide for every queued request; returns the decisions and the state they lead to.

        With `explain=False` (the simulator) requests the cycle did not need to examine get no Pending
        entry, which keeps a cycle over a long queue cheap.
        """
        work = snapshot.copy()
        self._now = now
        ctx = PolicyContext(self.config, now, work, self._tenant_gpus(work))
        ordered = sorted(queue, key=self._sort_key(ctx))
        result = CycleResult()
        reservation: _Reservation | None = None
        blocked: Request | None = None
        examined = 0
        preempt_budget = self.config.max_preemption_attempts if self.policy.preempt is not None else 0
        shrunk = False  # grown elastic jobs give their extra GPUs back (once a cycle) when work is blocked
        before: list[Allocation] = []  # the jobs it shrank, as they were
        for pos, req in enumerate(ordered):
            if blocked is not None:
                stop = ""
                if self.policy.backfill == "none":
                    stop = f"waits behind {blocked.id} (no backfill)"
                elif examined >= self.config.backfill_depth:
                    stop = "beyond the backfill window of this cycle"
                elif work.free_whole_gpus() == 0 and preempt_budget == 0 and req.milli == FULL:
                    stop = "no free GPUs"
                if stop:
                    if not explain:
                        break
                    result.pending.append(Pending(req.id, stop, pos))
                    continue
                examined += 1
            k = req.gpus
            held_back = reservation is not None and not self._easy_allows(reservation, req, k, now)
            if held_back:
                assert reservation is not None
                placed = PlacementResult(None, f"would delay the reservation of {reservation.request.id}")
            else:
                placed = self._try(work, req, k)
                if placed.gpus is None and req.elastic and req.min_gpus is not None and req.min_gpus < k:
                    k = req.min_gpus
                    placed = self._try(work, req, k)
                if placed.gpus is None and self.policy.elastic and not shrunk:
                    shrunk = True
                    if self._shrink_grown(work, result, before):
                        k = req.gpus
                        placed = self._try(work, req, k)
                if placed.gpus is not None and reservation is not None:
                    self._easy_consume(reservation, req, k, now)
            why = ""  # a placement made by preemption says what it evicted
            if placed.gpus is None and self.policy.preempt is not None and preempt_budget > 0 and not held_back:
                preempt_budget -= 1
                gave = self._shrink_for(work, req, k, ctx, result) if self.config.elastic_shrink else []
                attempt = self._try(work, req, k) if gave else PlacementResult(None, "")
                if attempt.gpus is not None:
                    before.extend(gave)
                    given = sum(a.gpu_count - work.allocations[a.id].gpu_count for a in gave)
                    why = f"shrank elastic work by {given} GPUs"
                else:
                    self._unshrink(work, result, gave)
                    attempt = self._preempt(work, req, k, ctx, result)
                    why = attempt.reason
                if attempt.gpus is not None:
                    placed = attempt
                else:  # the reason says why preemption could not make room either
                    placed, why = PlacementResult(None, f"{placed.reason}; {attempt.reason}"), ""
            if placed.gpus is not None:
                self._commit(work, req, placed.gpus, now, result, ctx, why)
                continue
            result.pending.append(Pending(req.id, placed.reason, pos))
            if blocked is None:
                blocked = req
            if reservation is None and self._wants_reservation(req, now):
                reservation = self._reserve_for(work, req, now)
        if before:
            self._give_back(work, result, before, snapshot)
        if self.policy.elastic and not result.pending:
            self._grow(work, result)
        return result, work

    # ---- plugins ---------------------------------------------------------------------------------
    def _sort_key(self, ctx: PolicyContext) -> Callable[[Request], tuple]:
        """Queue-sort plugin. Keys of static policies depend on the request alone and are memoised
        (by identity: the same Request object across cycles), so long queues sort cheaply."""
        key = self.policy.sort_key
        if not self.policy.static_key:
            return lambda r: key(r, ctx)
        memo = self._key_memo

        def cached(r: Request) -> tuple:
            hit = memo.get(id(r))
            if hit is not None and hit[0] is r:
                return hit[1]
            k = key(r, ctx)
            memo[id(r)] = (r, k)
            return k

        if len(memo) > 4 * (len(ctx.state.allocations) + 100_000):
            memo.clear()
        return cached

    def _try(self, work: ClusterState, req: Request, k: int) -> PlacementResult:
        if k > work.n_gpus:
            return PlacementResult(None, f"needs {k} GPUs; the cluster has {work.n_gpus}")
        if req.milli == FULL and k > 0:
            free = work.free_whole_gpus()
            if free < k:  # cheap filter before the placement plugin scans nodes
                return PlacementResult(None, f"needs {k} GPUs; {free} free")
        return self._compact(work, req, k, holds.place(self.placer, work, req, k, self.policy.class_preemption))

    def _compact(self, work: ClusterState, req: Request, k: int, placed: PlacementResult) -> PlacementResult:
        """Locality wait: a gang one node could hold, placed over several, waits (a bounded time) for one node; not
        one whose owner asked for `topology: any` (start on any GPUs, now)."""
        wait = self.config.locality_wait_s
        if not wait or req.topology == "any" or placed.gpus is None or k < 2 or req.milli < FULL or k > work.gpn.max():
            return placed
        nodes = work.gpu_node[np.asarray(placed.gpus, dtype=np.int64)]
        if nodes.min() == nodes.max() or self._now - req.waiting_since >= wait:
            return placed
        return PlacementResult(None, f"waits for {k} GPUs in one node (up to {wait:g} s) rather than split")

    def _commit(
        self,
        work: ClusterState,
        req: Request,
        gpus: np.ndarray,
        now: float,
        result: CycleResult,
        ctx: PolicyContext,
        reason: str = "",
    ) -> None:
        est_end = now + req.est_runtime if req.est_runtime is not None else None
        alloc = Allocation(_alloc_id(req), req, tuple(int(g) for g in gpus), now, req.milli, est_end)
        work.reserve(alloc)
        share = len(gpus) * req.milli / FULL
        ctx.tenant_gpus[req.tenant] = ctx.tenant_gpus.get(req.tenant, 0.0) + share
        result.placed.append(Place(req.id, alloc.gpus, req.milli, reason))

    @staticmethod
    def _tenant_gpus(state: ClusterState) -> dict[str, float]:
        out: dict[str, float] = {}
        for a in state.allocations.values():
            out[a.request.tenant] = out.get(a.request.tenant, 0.0) + a.gpu_count * a.milli / FULL
        return out

    # ---- backfill reservations ---------------------------------------------------------------------
    def _wants_reservation(self, req: Request, now: float) -> bool:
        if self.policy.backfill == "easy":
            return True
        return self.policy.starvation_guard and now - req.waiting_since >= self.config.starvation_s

    @staticmethod
    def _reserve_for(work: ClusterState, req: Request, now: float) -> _Reservation:
        """When enough GPUs the head may use (its GPU type, nodes taking work) free up, per estimates."""
        usable = work.usable_nodes(req.gpu_type)
        free = int(work.node_whole[usable].sum())
        ends = sorted(
            (a.est_end if a.est_end is not None else float("inf"), a.gpu_count)
            for a in work.allocations.values()
            if a.milli == FULL and bool(usable[work.gpu_node[a.gpus[0]]])
        )
        shadow = now
        for end, n in ends:
            if free >= req.gpus:
                break
            free += n
            shadow = end
        if free < req.gpus:
            shadow = float("inf")
        return _Reservation(req, shadow, max(0, free - req.gpus))

    @staticmethod
    def _easy_allows(res: _Reservation, req: Request, k: int, now: float) -> bool:
        """EASY rule: start now only if done before the head's shadow time, or using only spare GPUs."""
        ends_in_time = req.est_runtime is not None and now + req.est_runtime <= res.shadow_time
        return ends_in_time or k <= res.extra

    @staticmethod
    def _easy_consume(res: _Reservation, req: Request, k: int, now: float) -> None:
        if not (req.est_runtime is not None and now + req.est_runtime <= res.shadow_time):
            res.extra -= k

    # ---- preemption statement -----------------------------------------------------------------------
    def _preempt(
        self, work: ClusterState, req: Request, k: int, ctx: PolicyContext, result: CycleResult
    ) -> PlacementResult:
        """A preemption statement: the GPUs it places on and what it evicted, or None and why it cannot make room.

        Victims are freed cheapest first until the request fits; those the placement does not need are given back.
        Evicting other work is bounded (`preempt_collateral` GPUs per GPU needed, so a 1-GPU job never evicts a
        64-GPU gang); spot work yielding to a higher class is not counted: spot work exists to be preempted, so an
        8-GPU on-demand job evicts a 32-GPU spot gang when nothing smaller makes room."""
        rule = self.policy.preempt
        assert rule is not None
        decided = {p.request_id for p in result.placed} | {r.allocation_id for r in result.resized}
        victims = [a for a in work.allocations.values() if a.id not in decided and rule(a, req, ctx)]
        if not victims:
            return PlacementResult(None, "nothing it may preempt")
        # cheapest victims first: lowest class, then smallest gang (least collateral), then most recently
        # started (least work lost)
        victims.sort(key=lambda a: (a.request.rank, a.gpu_count, -a.start_time))
        scratch = work.copy()
        spot = self.policy.class_preemption  # spot work's GPUs can be had by a plan's work
        floor = holds.floor(work, req, spot) if work.held else {}  # what plans hold back from it, to stay to be had
        local = PolicyContext(ctx.config, ctx.now, scratch, dict(ctx.tenant_gpus))
        freed: list[Allocation] = []
        placed = PlacementResult(None, "")
        for v in victims[: self.config.max_victims]:
            if not rule(v, req, local):  # e.g. the victim's tenant is back at its quota
                continue
            scratch.unreserve(v.id)
            t = v.request.tenant
            local.tenant_gpus[t] = local.tenant_gpus.get(t, 0.0) - v.gpu_count * v.milli / FULL
            freed.append(v)
            if scratch.free_whole_gpus() < k and req.milli == FULL:
                continue
            placed = self._compact(scratch, req, k, holds.place(self.placer, scratch, req, k, spot))
            if placed.gpus is not None:
                break
        if placed.gpus is None:
            why = f": {placed.reason}" if floor and placed.reason else ""  # what plans hold back, said
            return PlacementResult(None, f"preempting up to {len(freed)} jobs would not make room{why}")
        used = set(int(g) for g in placed.gpus)
        if req.exclusive:  # an exclusive gang owns its nodes: nobody may be given back onto them
            nodes = np.unique(scratch.gpu_node[np.asarray(placed.gpus, dtype=np.int64)])
            used = {g for n in nodes for g in scratch.cluster.gpus_of_node(int(n))}
        evicted = []
        if scratch.tracks_host or floor:  # the placement's GPUs, CPU and memory count as taken when victims come back
            scratch.reserve(Allocation(_SCRATCH + req.id, req, tuple(int(g) for g in placed.gpus), ctx.now, req.milli))
        for v in freed:  # give back what the placement does not use (nor the CPU and memory beside it), while what
            # plans hold back from the request stays to be had
            if used.isdisjoint(v.gpus) and scratch.host_fits(v) and holds.keeps(scratch, floor, req, v, spot):
                scratch.reserve(v, restore=True)
            else:
                evicted.append(v)
        bounded = [v for v in evicted if not (self.policy.class_preemption and _yields(v, req))]
        lost = sum(v.gpu_count for v in bounded)
        if lost > self.config.preempt_collateral * max(k, len(used), 1):
            classes = "/".join(sorted({v.request.priority for v in bounded}))
            return PlacementResult(
                None,
                f"preemption would evict {lost} GPUs of {classes} gangs (limit "
                f"{self.config.preempt_collateral:g}x the request)",
            )
        if scratch.tracks_host or floor:
            scratch.unreserve(_SCRATCH + req.id)  # the caller commits the placement
        # commit the statement
        work.__dict__.update(scratch.__dict__)
        for v in evicted:
            t = v.request.tenant
            ctx.tenant_gpus[t] = ctx.tenant_gpus.get(t, 0.0) - v.gpu_count * v.milli / FULL
            by_class = self.policy.class_preemption and v.request.rank < req.rank
            why = f": {v.request.priority} work gives way to {req.priority} work" if by_class else ""
            reason = f"preempted for {req.priority} work {req.id} ({self.policy.name}{why})"
            result.preempted.append(Preempt(v.id, reason, req.id))
        gpus_of: dict[str, int] = {}  # GPUs evicted by class
        for v in evicted:
            gpus_of[v.request.priority] = gpus_of.get(v.request.priority, 0) + v.gpu_count
        what = " and ".join(f"{n} GPUs of {c} work" for c, n in sorted(gpus_of.items()))
        return PlacementResult(placed.gpus, f"preempted {what}")
