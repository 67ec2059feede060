"""`oracle-srsf`: a clairvoyant reference for the simulator, not a policy anyone can run.

It reads every job's true remaining work (the simulator's own bookkeeping), which no real scheduler knows, so it
exists only in `suanli sim` and the benchmarks, to say how far a real policy is from a good bound; the server's
settings refuse the name (`ORACLE_POLICIES`). At every event it repacks the cluster from scratch:

* order: preemptive shortest-remaining-service-first, service = remaining seconds x GPUs (Tiresias' SRSF);
* placement: a gang of at most a node's GPUs inside one node (best fit); a larger gang on whole nodes (the
  tightest cell that has them), so it never pays a placement slowdown for a split small gang;
* a job it stops, or moves, pays the same restart cost as a real preemption (the simulator charges it).

The repack decides which jobs run; running jobs it keeps stay on their GPUs, and a job that does not fit around
them moves the fewest of them (a move restarts the job). Classes, elastic ranges and holds are
ignored: it runs every job at the size it asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from suanli.sched.placement import place_slice, topology_aware
from suanli.sched.state import ClusterState
from suanli.sched.types import FULL, Allocation, CycleResult, Place, Preempt, Request

ORACLE_SRSF = "oracle-srsf"
ORACLE_POLICIES = (ORACLE_SRSF,)


@dataclass(frozen=True)
class _NoPolicy:
    name: str = ORACLE_SRSF
    elastic: bool = False


class OracleScheduler:
    """Same `cycle` shape as `sched.Scheduler`; `remaining[i]` is job i's true remaining reference seconds."""

    def __init__(self, remaining: Sequence[float]) -> None:
        self.remaining = remaining
        self.policy = _NoPolicy()
        self._gpn: dict[object, int] = {}

    def service(self, req: Request) -> float:
        return self.remaining[int(req.id)] * req.gpus * req.milli / FULL

    def _node_gpus(self, state: ClusterState, req: Request) -> int:
        key = req.gpu_type
        if key not in self._gpn:
            usable = state.nodes_of_type(req.gpu_type)
            self._gpn[key] = int(state.gpn[usable].max()) if usable.any() else 0
        return self._gpn[key]

    def shaped(self, state: ClusterState, req: Request) -> Request:
        """The request as the oracle places it: larger than a node → whole nodes (exclusive)."""
        if req.milli == FULL and req.gpus > self._node_gpus(state, req) and not req.exclusive:
            return replace(req, exclusive=True)
        return req

    def place(self, state: ClusterState, req: Request) -> tuple[int, ...] | None:
        """GPUs by the oracle's rule, or None: a slice best fit, a small gang in one node, a large one on whole nodes."""
        k = req.gpus
        if req.milli < FULL:
            got = place_slice(state, req).gpus
        else:
            if k > state.free_whole_gpus():
                return None
            got = topology_aware(state, req, k).gpus
            if got is not None and not req.exclusive and k > 1:
                nodes = state.gpu_node[got]
                if nodes.min() != nodes.max():
                    return None  # a small gang is never split over nodes
        return None if got is None else tuple(int(g) for g in got)

    def _pack(self, state: ClusterState, order: list[Request], now: float) -> dict[str, tuple[int, ...]]:
        """Walk `order` on `state`: the GPUs each job that fits gets (reserved on `state`)."""
        out: dict[str, tuple[int, ...]] = {}
        for req in order:
            if req.milli == FULL and state.free_whole_gpus() < req.gpus:
                continue
            gpus = self.place(state, req)
            if gpus is not None:
                state.reserve(Allocation(req.id, req, gpus, now, req.milli))
                out[req.id] = gpus
        return out

    def _make_room(self, state: ClusterState, req: Request, movable: dict[str, Allocation]) -> list[Allocation]:
        """Unreserve the fewest GPUs of `movable` jobs that let `req` fit by the rule (one node, or whole nodes);
        what was unreserved (empty, with nothing changed, when no choice makes room)."""
        usable = state.usable_nodes(req.gpu_type)
        on_node: dict[int, list[Allocation]] = {}
        for al in movable.values():
            for n in set(int(state.gpu_node[g]) for g in al.gpus):
                on_node.setdefault(n, []).append(al)
        pinned = state.node_whole.copy()  # free GPUs per node, plus what moving its movable jobs frees
        for n, als in on_node.items():
            if any(len(set(int(state.gpu_node[g]) for g in a.gpus)) > 1 for a in als):
                continue  # a node of a multi-node gang: moving it frees other nodes too; not worth it here
            pinned[n] += sum(a.gpu_count for a in als if a.milli == FULL)
        if req.milli < FULL:
            return []
        if req.exclusive:
            whole = np.flatnonzero(usable & (pinned == state.gpn))
            need = -(-req.gpus // int(state.gpn[whole].max())) if whole.size else 1
            if whole.size < need:
                return []
            cost = state.gpn[whole] - state.node_whole[whole]
            nodes = whole[np.argsort(cost, kind="stable")][:need]
        else:
            fits = np.flatnonzero(usable & (pinned >= req.gpus))
            if not fits.size:
                return []
            nodes = fits[
                [int(np.argmin(req.gpus - state.node_whole[fits] + 1000 * (state.node_whole[fits] >= req.gpus)))]
            ]
        moved: list[Allocation] = []
        for n in nodes:
            als = sorted(on_node.get(int(n), []), key=self.service_of, reverse=True)
            for al in als:
                if not req.exclusive and state.node_whole[n] >= req.gpus:
                    break
                if al.id in state.allocations:
                    state.unreserve(al.id)
                    moved.append(al)
        return moved

    def _select_counts(self, state: ClusterState, order: list[Request]) -> set[str] | None:
        """The repack's selection on free-GPU counts per node (best fit; whole nodes for large gangs): exact for whole
        GPUs of any model without host limits, and far cheaper than placing GPU by GPU; None for other work."""
        if any(r.milli < FULL or r.gpu_type is not None or r.cpu_milli or r.memory_mib for r in order):
            return None
        healthy = state.gpu_node[state.gpu_ok]
        gpn = [int(x) for x in np.bincount(healthy, minlength=state.cluster.n_nodes)]
        ok = state.node_ok.copy()  # all nodes as if empty (exclusive holders are running jobs, repacked too)
        free = [g if bool(ok[n]) else 0 for n, g in enumerate(gpn)]
        levels: dict[int, set[int]] = {}
        for n, f in enumerate(free):
            if f:
                levels.setdefault(f, set()).add(n)
        top = max(gpn)
        total = sum(free)
        out: set[str] = set()
        for req in order:
            k = req.gpus
            if k > total:
                continue
            if k == 0:
                out.add(req.id)
                continue
            if k <= top:
                level = next((lv for lv in range(k, top + 1) if levels.get(lv)), None)
                if level is None:
                    continue
                node = min(levels[level])
                levels[level].discard(node)
                if level - k:
                    levels.setdefault(level - k, set()).add(node)
                free[node] -= k
            else:
                whole = sorted((n for lv, ns in levels.items() for n in ns if lv == gpn[n]), key=lambda n: (-gpn[n], n))
                take, got = [], 0
                for n in whole:
                    if got >= k:
                        break
                    take.append(n)
                    got += gpn[n]
                if got < k:
                    continue
                for n in take:
                    levels[free[n]].discard(n)
                    free[n] = 0
                k = got
            total -= k
            out.add(req.id)
        return out

    def service_of(self, al: Allocation) -> float:
        return self.service(al.request)

    def cycle(
        self, snapshot: ClusterState, queue: Sequence[Request], now: float, explain: bool = False
    ) -> tuple[CycleResult, ClusterState]:
        running = dict(snapshot.allocations)
        jobs = [self.shaped(snapshot, a.request) for a in running.values()]
        jobs += [self.shaped(snapshot, r) for r in queue]
        order = sorted(jobs, key=lambda r: (self.service(r), r.submit_time, r.id))
        work = snapshot.copy()
        selected = self._select_counts(work, order)
        if selected is None:  # packed from scratch, GPU by GPU
            empty = snapshot.copy()
            for aid in running:
                empty.unreserve(aid)
            selected = set(self._pack(empty, order, now))
        # fewest moves: the selected running jobs stay where they are; a job that does not fit around them moves the
        # fewest of them (those with most service left first), and the moved ones are packed again afterwards
        keep = {a: al for a, al in running.items() if a in selected}
        for aid in running:
            if aid not in keep:
                work.unreserve(aid)
        placed: dict[str, tuple[int, ...]] = {a: al.gpus for a, al in keep.items()}
        movable = dict(keep)
        retry: list[Request] = []
        for req in order:
            if req.id not in selected or req.id in keep:
                continue
            gpus = self.place(work, req)
            if gpus is None:
                moved = self._make_room(work, req, movable)
                gpus = self.place(work, req) if moved else None
                if gpus is None:
                    for al in moved:
                        work.reserve(al, restore=True)
                    continue
                for al in moved:
                    del movable[al.id], placed[al.id]
                    retry.append(al.request)
            work.reserve(Allocation(req.id, req, gpus, now, req.milli))
            placed[req.id] = gpus
        placed.update(self._pack(work, sorted(retry, key=lambda r: (self.service(r), r.submit_time, r.id)), now))
        result = CycleResult()
        for aid, al in running.items():
            if placed.get(aid) != al.gpus:
                result.preempted.append(Preempt(aid, f"{ORACLE_SRSF}: repacked"))
        by_id = {r.id: r for r in order}
        for rid, gpus in placed.items():
            al = running.get(rid)
            if al is None or al.gpus != gpus:
                result.placed.append(Place(rid, gpus, by_id[rid].milli, ORACLE_SRSF))
        return result, work


def is_oracle(policy: str) -> bool:
    return policy in ORACLE_POLICIES


def order_key(remaining: Sequence[float], reqs: Sequence[Request]) -> list[str]:
    """Ids in the oracle's order (for tests): least remaining service first."""
    o = OracleScheduler(remaining)
    return [r.id for r in sorted(reqs, key=lambda r: (o.service(r), r.submit_time, r.id))]


__all__ = ["ORACLE_POLICIES", "ORACLE_SRSF", "OracleScheduler", "is_oracle", "order_key"]
