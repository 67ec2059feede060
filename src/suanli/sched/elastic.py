"""Elastic work in the cycle: shrinking it for waiting work (and undoing shrinks that made no room), growing it into
idle GPUs while goodput pays, and the resize an owner asks for (`suanli scale`). A mixin of `framework.Scheduler`:
the same state, placement plugin and policy, split out to keep the cycle's own module short.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from suanli.sched import holds
from suanli.sched.placement import PlacementResult, Placer
from suanli.sched.policies import Policy, PolicyContext, SchedulerConfig, served
from suanli.sched.scaling import ScalingModel
from suanli.sched.state import ClusterState
from suanli.sched.types import FULL, Allocation, CycleResult, Pending, Place, Request, Resize


class Elastic:
    """Grow, shrink and resize: what `Scheduler` does with elastic work (it provides these attributes)."""

    config: SchedulerConfig
    policy: Policy
    placer: Placer
    _scaling_models: dict[int, ScalingModel]
    _now: float
    _try: Callable[[ClusterState, Request, int], PlacementResult]

    def _shrink_for(
        self, work: ClusterState, req: Request, k: int, ctx: PolicyContext, result: CycleResult
    ) -> list[Allocation]:
        """Preemption that counts its cost: elastic work the policy may preempt for `req` gives up GPUs by shrinking
        (toward its minimum for a smaller gang, toward its ask for one as large; most attained service first) rather
        than being evicted whole; a shrink restarts it at the smaller size (a resize) and takes only the GPUs `req` is
        short of. Returns the jobs shrunk, as they were: the caller undoes the shrinks (`_unshrink`) unless `req` then
        fits, and the cycle's end gives back what no placement took."""
        rule = self.policy.preempt
        need = k - work.free_whole_gpus()
        if rule is None or not self.policy.elastic or req.milli < FULL or need <= 0:
            return []
        decided = {p.request_id for p in result.placed} | {r.allocation_id for r in result.resized}

        def floor(a: Allocation) -> int:
            """A gang smaller than the victim's ask may shrink it to its minimum; a gang as large may take only what it
            grew beyond its ask. Else each fresh large gang shrinks the older ones to their minimum in turn, and the
            longest jobs share their GPUs round-robin and all end late (docs/scheduling.md, "Four switches")."""
            low = a.request.min_gpus or a.gpu_count
            return low if req.gpus < a.request.gpus else max(low, a.request.gpus)

        victims = [
            a
            for a in work.allocations.values()
            if a.request.elastic
            and a.milli == FULL
            and a.id not in decided
            and a.gpu_count > floor(a)
            and rule(a, req, ctx)
        ]
        victims.sort(key=lambda a: (-served(a, ctx.now), a.id))
        given = 0
        shrunk: list[Allocation] = []
        for a in victims:
            if given >= need:
                break
            want = max(floor(a), a.gpu_count - (need - given))
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
