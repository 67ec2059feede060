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
from suanli.sched.placement import PLACEMENTS, PlacementResult, Placer
from suanli.sched.policies import Policy, PolicyContext, SchedulerConfig, policy, served
from suanli.sched.scaling import ScalingModel
from suanli.sched.state import ClusterState
from suanli.sched.types import FULL, Allocation, CycleResult, Pending, Place, Preempt, Request, Resize


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


class Scheduler:
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
        """Locality wait: a gang one node could hold, placed over several, waits (a bounded time) for one node."""
        wait = self.config.locality_wait_s
        if not wait or placed.gpus is None or k < 2 or req.milli < FULL or k > work.gpn.max():
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

    # ---- elastic grow / shrink ----------------------------------------------------------------------
    def _shrink_for(
        self, work: ClusterState, req: Request, k: int, ctx: PolicyContext, result: CycleResult
    ) -> list[Allocation]:
        """Preemption that counts its cost: elastic work the policy may preempt for `req` gives up GPUs by shrinking
        (toward its minimum, most attained service first) rather than being evicted whole; a shrink restarts it at the
        smaller size (a resize) and takes only the GPUs `req` is short of. Returns the jobs shrunk, as they were: the
        caller undoes the shrinks (`_unshrink`) unless `req` then fits, and the cycle's end gives back what no
        placement took."""
        rule = self.policy.preempt
        need = k - work.free_whole_gpus()
        if rule is None or not self.policy.elastic or req.milli < FULL or need <= 0:
            return []
        decided = {p.request_id for p in result.placed} | {r.allocation_id for r in result.resized}
        victims = [
            a
            for a in work.allocations.values()
            if a.request.elastic
            and a.milli == FULL
            and a.id not in decided
            and a.gpu_count > (a.request.min_gpus or a.gpu_count)
            and rule(a, req, ctx)
        ]
        victims.sort(key=lambda a: (-served(a, ctx.now), a.id))
        given = 0
        shrunk: list[Allocation] = []
        for a in victims:
            if given >= need:
                break
            want = max(a.request.min_gpus or a.gpu_count, a.gpu_count - (need - given))
            if self._resize(work, result, a, want, f"shrunk for waiting work {req.id}"):
                shrunk.append(a)
                given += a.gpu_count - work.allocations[a.id].gpu_count
        return shrunk

    @staticmethod
    def _unshrink(work: ClusterState, result: CycleResult, shrunk: list[Allocation]) -> None:
        """Undo shrinks that made no room (latest first: nothing was placed since, so their GPUs are free)."""
        for a in reversed(shrunk):
            work.unreserve(a.id)
            work.reserve(a, restore=True)
        ids = {a.id for a in shrunk}
        result.resized = [r for r in result.resized if r.allocation_id not in ids]

    def _scaling(self, work: ClusterState) -> ScalingModel:
        model = self._scaling_models.get(id(work.cluster))
        if model is None or model.cluster is not work.cluster:
            model = ScalingModel(work.cluster)
            self._scaling_models[id(work.cluster)] = model
        return model

    def _shrink_grown(self, work: ClusterState, result: CycleResult, before: list[Allocation]) -> bool:
        """Grown elastic jobs shrink back to their asks (placed again: a resize restarts them anyway, so they may
        move); `before` gets each one shrunk as it was."""
        grown = [a for a in work.allocations.values() if a.request.elastic and a.gpu_count > a.request.gpus]
        for a in grown:
            if self._resize(work, result, a, a.request.gpus, "shrunk to free GPUs for waiting work"):
                before.append(a)
        return bool(grown)

    def _give_back(
        self, work: ClusterState, result: CycleResult, before: list[Allocation], start: ClusterState
    ) -> None:
        """A shrink frees GPUs for waiting work: the jobs whose GPUs no work placed in the cycle took (directly, or by
        a job shrunk later that moved onto them) get them back, and their shrink is undone (while what plans hold back
        from them stays to be had, as at the cycle's `start`). Latest shrunk first: a job shrunk later may have moved
        onto GPUs an earlier one gave up, never the reverse."""
        undone = set()
        spot = self.policy.class_preemption
        for a in reversed(before):
            small = work.allocations[a.id]  # decided this cycle: not preempted since
            work.unreserve(a.id)
            held = np.asarray(a.gpus, dtype=np.int64)
            idle = bool(np.all(work.free[held] == FULL)) and not work.node_exclusive[work.gpu_node[held]].any()
            floor = holds.floor(start, a.request, spot) if work.held else {}
            if idle and work.host_fits(a) and holds.keeps(work, floor, a.request, a, spot):
                work.reserve(a, restore=True)
                undone.add(a.id)
            else:
                work.reserve(small, restore=True)
        if undone:
            result.resized = [r for r in result.resized if r.allocation_id not in undone]

    def _grow(self, work: ClusterState, result: CycleResult) -> None:
        """Nothing waits: grow elastic jobs, oldest first (`grow_las`: least attained service first), while another
        GPU still pays (goodput)."""
        resized_now = {r.allocation_id for r in result.resized}
        elastic = [a for a in work.allocations.values() if a.request.elastic and a.id not in resized_now]
        if self.config.grow_las:  # least attained service first, as the queue is ordered
            ctx = PolicyContext(self.config, self._now, work, {})
            elastic.sort(key=lambda a: (ctx.las_level(served(a, self._now)), a.start_time))
        else:
            elastic.sort(key=lambda a: a.start_time)
        for a in elastic:
            req = a.request
            assert req.max_gpus is not None
            free = holds.room(work, req, self.policy.class_preemption) if work.held else work.free_whole_gpus()
            if a.gpu_count >= req.max_gpus or free <= 0:
                continue
            model = req.model.preset if req.model else None
            want = self._scaling(work).best_size(req.gpus, a.gpu_count, min(req.max_gpus, a.gpu_count + free), model)
            if want > a.gpu_count:
                self._resize(work, result, a, want, "grown into idle GPUs")

    # ---- a resize someone asked for (the server's `suanli scale`) ------------------------------------------
    def resize(
        self, snapshot: ClusterState, allocation_id: str, gpus: int, verb: str, request: Request | None = None
    ) -> tuple[Resize | Pending, ClusterState]:
        """Resize one allocation to `gpus`, as its owner asked; pure like `cycle` (the snapshot is copied).

        A shrink keeps a subset of the GPUs it holds: the nodes it holds most of (the same count on each when the
        request fixes its node count), so no rank moves to a GPU it did not have. A grow is placed by the placement
        plugin with the GPUs it holds counted free, as the elastic plugin's `_resize` does (topology-aware; it may
        move). `request` replaces the allocation's (the server pins the size the owner chose). Returns the
        decision, or a Pending saying why it cannot be done now, and the state it leads to."""
        work = snapshot.copy()
        a = work.allocations[allocation_id]
        req = request or a.request
        if gpus < 1 or gpus == a.gpu_count or a.milli != FULL:
            return Pending(a.id, f"cannot resize {a.gpu_count} whole GPUs to {gpus}", 0), work
        if gpus < a.gpu_count:
            chosen = self._subset(work, a, gpus)
            if chosen is None:
                return Pending(a.id, f"{gpus} GPUs do not divide over its {req.nodes} nodes", 0), work
            work.unreserve(a.id)
            work.reserve(Allocation(a.id, req, chosen, a.start_time, a.milli, a.est_end), restore=True)
            return Resize(a.id, chosen, f"{verb}: {a.gpu_count} → {gpus}"), work
        work.unreserve(a.id)
        placed = self._try(work, req, gpus)
        if placed.gpus is None:
            work.reserve(a, restore=True)
            return Pending(a.id, f"{placed.reason} (counting the {a.gpu_count} it holds)", 0), work
        new = Allocation(a.id, req, tuple(int(g) for g in placed.gpus), a.start_time, a.milli, a.est_end)
        work.reserve(new)
        return Resize(a.id, new.gpus, f"{verb}: {a.gpu_count} → {gpus}"), work

    @staticmethod
    def _subset(work: ClusterState, a: Allocation, gpus: int) -> tuple[int, ...] | None:
        """`gpus` of the allocation's own GPUs: from the nodes it holds most of (then the lowest), lowest GPUs first;
        with a fixed node count, the same number on each of its nodes (None when `gpus` does not divide)."""
        by_node: dict[int, list[int]] = {}
        for g in sorted(a.gpus):
            by_node.setdefault(int(work.gpu_node[g]), []).append(g)
        if a.request.nodes is not None:
            if gpus % len(by_node):
                return None
            per = gpus // len(by_node)
            return tuple(sorted(g for held in by_node.values() for g in held[:per]))
        out: list[int] = []
        for node in sorted(by_node, key=lambda n: (-len(by_node[n]), n)):
            out += by_node[node][: gpus - len(out)]
        return tuple(sorted(out))

    def _resize(self, work: ClusterState, result: CycleResult, a: Allocation, want: int, verb: str) -> bool:
        work.unreserve(a.id)
        placed = holds.place(self.placer, work, a.request, want, self.policy.class_preemption)
        gpus = None if placed.gpus is None else tuple(int(g) for g in placed.gpus)
        own = gpus is None and want < a.gpu_count and bool(work.held)  # moving would take GPUs held for plans:
        if own:
            gpus = self._subset(work, a, want)  # a shrink keeps some of its own
        if gpus is None or len(gpus) == a.gpu_count:
            work.reserve(a, restore=True)
            return False
        new = Allocation(a.id, a.request, gpus, a.start_time, a.milli, a.est_end)
        work.reserve(new, restore=own)
        reason = f"{verb}: {a.gpu_count} → {new.gpu_count}"
        placed_now = {p.request_id: i for i, p in enumerate(result.placed)}
        if a.id in placed_now:  # placed in this very cycle: one Place decision with the final GPUs
            result.placed[placed_now[a.id]] = Place(a.id, new.gpus, a.milli, reason)
        else:
            result.resized.append(Resize(a.id, new.gpus, reason))
        return True
