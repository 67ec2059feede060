"""The scheduler's view of a cluster: who holds which GPU, what is free, what is healthy.

`ClusterState` is a value the caller owns. A scheduling cycle never mutates its input: it works on a
copy, reserving and unreserving GPUs as plugins decide, and returns the decisions. Free capacity is kept
in milli-GPUs per GPU (1000 = a whole free GPU) with a per-node count of whole free GPUs
maintained incrementally, so placement queries stay O(nodes) NumPy scans even at 100,000 GPUs.

A state may also track each node's host CPU and memory (`host=`): then a request's `cpu_milli` and
`memory_mib` are taken from the nodes its GPUs are on, and placement skips nodes that lack them (a node
with free GPUs but no free cores cannot run another pod). Untracked, they cost nothing.

A state may hold GPUs back for tenants' reserved-class work (`hold`: a count per GPU model and tenant, the plans'
idle reservations); `sched.holds` keeps other work off them. A tenant's reserved allocations take from its hold as
they are reserved and give back what they took when unreserved; while anything is held, the state also counts the
whole GPUs of each model that spot work holds (they can be had by preempting it).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from suanli.sched.types import FULL, Allocation, Request
from suanli.topology.model import Cluster

UNLIMITED = 1 << 40  # the CPU or memory of a node nobody stated: never the limit


# A request's CPU and memory are for its `gpus` GPUs, taken per GPU: the one rule, in two directions.
def host_share(need: Any, gpus_here: Any, gpus: int) -> Any:
    """What `gpus_here` of a request's GPUs take of `need` (asked for `gpus` GPUs), rounded up."""
    return -(-need * gpus_here // max(1, gpus))


def gpus_carried(free: Any, need: int, gpus: int) -> Any:
    """The most of a request's GPUs that `free` carries: the largest j with host_share(need, j, gpus) <= free."""
    return free * max(1, gpus) // need


def host_capacity(cpus: ArrayLike, memory_mib: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
    """`ClusterState(host=...)` from each node's stated cores and MiB (0: not stated, so not a limit); None when
    no node states either (nothing to track)."""
    cpu, mem = np.asarray(cpus, dtype=np.int64), np.asarray(memory_mib, dtype=np.int64)
    if not (cpu > 0).any() and not (mem > 0).any():
        return None
    return np.where(cpu > 0, cpu * 1000, UNLIMITED), np.where(mem > 0, mem, UNLIMITED)


def cluster_host(cluster: Cluster) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
    """The host capacity a cluster spec states per node group (`cpus`, `memory_gib`), for `ClusterState(host=)`."""
    cpus = np.array([g.cpus or 0 for g in cluster.groups], dtype=np.int64)[cluster.node_group]
    mem = np.array([g.memory_mib for g in cluster.groups], dtype=np.int64)[cluster.node_group]
    return host_capacity(cpus, mem)


class ClusterState:
    """Free capacity, health and allocations of one cluster."""

    def __init__(self, cluster: Cluster, host: tuple[ArrayLike, ArrayLike] | None = None) -> None:
        """`host`: each node's CPU (milli-cores) and memory (MiB) to track, in node order; None: not tracked."""
        self.cluster = cluster
        self.cpu_free: NDArray[np.int64] | None = None  # free milli-cores per node, when tracked
        self.mem_free: NDArray[np.int64] | None = None  # free MiB per node, when tracked
        self.host_total: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None  # what the nodes have in all
        if host is not None:
            cpu, mem = (np.array(a, dtype=np.int64) for a in host)
            if cpu.shape != (cluster.n_nodes,) or mem.shape != (cluster.n_nodes,):
                raise ValueError(f"host: one CPU and one memory figure per node ({cluster.n_nodes} nodes)")
            if (cpu < 0).any() or (mem < 0).any():
                raise ValueError("host: CPU and memory must be >= 0")
            self.cpu_free, self.mem_free = cpu, mem
            self.host_total = (cpu.copy(), mem.copy())
        self.free = np.full(cluster.n_gpus, FULL, dtype=np.int32)  # free milli-GPUs per GPU
        self.gpu_ok = np.ones(cluster.n_gpus, dtype=bool)
        self.node_ok = np.ones(cluster.n_nodes, dtype=bool)  # False: draining or down, no new work
        self.node_exclusive = np.zeros(cluster.n_nodes, dtype=bool)  # held whole by an exclusive allocation
        self.allocations: dict[str, Allocation] = {}
        self.held: dict[str, dict[str, int]] = {}  # GPU model -> tenant -> whole GPUs held back for its reserved work
        self.hold_taken: dict[str, tuple[tuple[str, int], ...]] = {}  # allocation -> (model, GPUs) it took from a hold
        self.spot_whole: dict[str, int] = {}  # while anything is held: GPU model -> whole GPUs spot work holds
        self._recount()

    # ---- copies and derived arrays --------------------------------------------------------------
    def copy(self) -> ClusterState:
        new = object.__new__(ClusterState)
        new.cluster = self.cluster
        new.free = self.free.copy()
        new.gpu_ok = self.gpu_ok.copy()
        new.node_ok = self.node_ok.copy()
        new.node_exclusive = self.node_exclusive.copy()
        new.cpu_free = None if self.cpu_free is None else self.cpu_free.copy()
        new.mem_free = None if self.mem_free is None else self.mem_free.copy()
        new.host_total = self.host_total
        new.allocations = dict(self.allocations)
        new.held = {m: dict(by) for m, by in self.held.items()}
        new.hold_taken = dict(self.hold_taken)
        new.spot_whole = dict(self.spot_whole)
        new.node_whole = self.node_whole.copy()
        new.whole_total = self.whole_total
        # share immutable topology caches
        for name in ("gpn", "node_leaf", "node_spine", "node_domain", "gpu_node", "models", "node_model"):
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name]
        return new

    def _recount(self) -> None:
        whole = (self.free == FULL) & self.gpu_ok
        self.node_whole = np.bincount(self.gpu_node[whole], minlength=self.cluster.n_nodes).astype(np.int32)
        self.whole_total = int(self.node_whole[self.node_ok & ~self.node_exclusive].sum())  # kept in step below

    @cached_property
    def gpn(self) -> NDArray[np.int32]:
        per_group = np.array([g.gpus_per_node for g in self.cluster.groups], dtype=np.int32)
        return per_group[self.cluster.node_group]

    @cached_property
    def node_leaf(self) -> NDArray[np.int64]:
        return self.cluster.node_leaf

    @cached_property
    def node_spine(self) -> NDArray[np.int64]:
        return self.cluster.node_spine

    @cached_property
    def node_domain(self) -> NDArray[np.int64]:
        return self.cluster.node_domain

    @cached_property
    def gpu_node(self) -> NDArray[np.int64]:
        return self.cluster.gpu_node

    @cached_property
    def models(self) -> tuple[str, ...]:
        """The GPU models of the cluster, sorted (`node_model` indexes them)."""
        return tuple(sorted({g.gpu.name for g in self.cluster.groups}))

    @cached_property
    def node_model(self) -> NDArray[np.int64]:
        per_group = np.array([self.models.index(g.gpu.name) for g in self.cluster.groups], dtype=np.int64)
        return per_group[self.cluster.node_group]

    # ---- queries ------------------------------------------------------------------------------
    @property
    def n_gpus(self) -> int:
        return self.cluster.n_gpus

    def usable_nodes(self, gpu_type: str | tuple[str, ...] | None) -> NDArray[np.bool_]:
        """Nodes that may take new work of this GPU type: a GPU model or a node-group name, or any of several."""
        return self.node_ok & ~self.node_exclusive & self.nodes_of_type(gpu_type)

    def nodes_of_type(self, gpu_type: str | tuple[str, ...] | None) -> NDArray[np.bool_]:
        """Nodes of this GPU type, whatever their state."""
        if gpu_type is None:
            return np.ones(self.cluster.n_nodes, dtype=bool)
        wanted = {gpu_type} if isinstance(gpu_type, str) else set(gpu_type)
        allowed = [i for i, g in enumerate(self.cluster.groups) if g.gpu.name in wanted or g.name in wanted]
        return np.isin(self.cluster.node_group, allowed)

    def free_whole_gpus(self) -> int:
        """Whole free healthy GPUs on nodes that take new work (not drained, not held exclusively)."""
        return self.whole_total

    def free_whole_of(self, model: str) -> int:
        """Whole free healthy GPUs of one model on nodes that take new work."""
        if model not in self.models:
            return 0
        nodes = self.node_ok & ~self.node_exclusive & (self.node_model == self.models.index(model))
        return int(self.node_whole[nodes].sum())

    def hold(self, counts: dict[str, dict[str, int]]) -> None:
        """Hold back, of each GPU model, whole GPUs for each tenant's reserved-class work (replacing any held):
        `{model: {tenant: gpus}}`, what its plans reserve and its work leaves idle (0: a plan all in use). The
        tenant's reserved allocations running now count as having taken theirs: unreserved (preempted, resized),
        their GPUs are held for it again."""
        self.held = {m: {t: max(0, int(n)) for t, n in by.items()} for m, by in counts.items() if by}
        self.hold_taken, self.spot_whole = {}, {}
        for a in self.allocations.values():
            if a.request.priority == "spot" and self.held:
                self._count_spot(a, +1)
            if a.request.priority != "reserved" or not a.gpus or a.milli != FULL:
                continue
            took = tuple((m, c) for m, c in self.per_model(a.gpus) if a.request.tenant in self.held.get(m, {}))
            if took:
                self.hold_taken[a.id] = took

    def per_model(self, gpus: ArrayLike) -> list[tuple[str, int]]:
        """(GPU model, how many) of these GPUs."""
        idx, n = np.unique(self.node_model[self.gpu_node[np.asarray(gpus, dtype=np.int64)]], return_counts=True)
        return [(self.models[i], c) for i, c in zip(idx.tolist(), n.tolist(), strict=True)]

    def _count_spot(self, alloc: Allocation, sign: int) -> None:
        """Whole GPUs of spot work on nodes that take work, per model (what preempting it would free)."""
        if alloc.milli != FULL or not alloc.gpus:
            return
        gpus = np.asarray(alloc.gpus, dtype=np.int64)
        for m, n in self.per_model(gpus[self.node_ok[self.gpu_node[gpus]]]):
            self.spot_whole[m] = self.spot_whole.get(m, 0) + sign * n

    def idle_gpus(self) -> int:
        """Healthy GPUs nobody holds any part of, on nodes that take work."""
        return self.free_whole_gpus()

    def allocated_gpus(self) -> float:
        """GPUs held, counting slices by their fraction."""
        return float((FULL - self.free[self.gpu_ok]).sum()) / FULL

    @property
    def tracks_host(self) -> bool:
        return self.cpu_free is not None

    def host_room(self, req: Request, *, empty: bool = False) -> NDArray[np.int64] | None:
        """How many GPUs of `req` each node's free CPU and memory can carry (None: no limit); `empty`: all of it, as
        if nothing ran. A request's CPU and memory are per `req.gpus` GPUs: placed on fewer or more (elastic), it
        takes its share per GPU."""
        if self.cpu_free is None or self.mem_free is None or not (req.cpu_milli or req.memory_mib):
            return None
        cpu, mem = self.host_total if empty and self.host_total is not None else (self.cpu_free, self.mem_free)
        k = max(1, req.gpus)
        room = self.gpn.astype(np.int64)
        for free, need in ((cpu, req.cpu_milli), (mem, req.memory_mib)):
            if need:
                room = np.minimum(room, gpus_carried(free, need, k))
        return np.maximum(room, 0)  # a restored allocation may have left a node over its capacity

    def _host_charge(self, alloc: Allocation) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """(nodes, CPU, memory) the allocation takes from each node its GPUs are on: the request's share per GPU
        (its totals over `req.gpus`), rounded up per node."""
        req = alloc.request
        gpus = np.asarray(alloc.gpus, dtype=np.int64)
        nodes, per = np.unique(self.gpu_node[gpus], return_counts=True)
        return nodes, host_share(req.cpu_milli, per, req.gpus), host_share(req.memory_mib, per, req.gpus)

    def host_fits(self, alloc: Allocation) -> bool:
        """Whether the nodes of `alloc`'s GPUs have the CPU and memory it takes free (always, untracked)."""
        host = self._host_of(alloc)
        if host is None:
            return True
        assert self.cpu_free is not None and self.mem_free is not None
        nodes, cpu, mem = host
        return bool(np.all(self.cpu_free[nodes] >= cpu) and np.all(self.mem_free[nodes] >= mem))

    def _host_of(self, alloc: Allocation) -> tuple[NDArray[np.int64], ...] | None:
        req = alloc.request
        if self.cpu_free is None or not (req.cpu_milli or req.memory_mib) or not alloc.gpus:
            return None
        return self._host_charge(alloc)

    def _counted(self, nodes: NDArray[np.int64]) -> NDArray[np.bool_]:
        return self.node_ok[nodes] & ~self.node_exclusive[nodes]

    # ---- reserve / unreserve -------------------------------------------------------------------
    def reserve(self, alloc: Allocation, *, restore: bool = False) -> None:
        """Take the allocation's GPUs. `restore=True` puts back an allocation the same cycle just released
        (a preemption or resize that did not need it): no health or exclusivity checks, it held them."""
        if alloc.id in self.allocations:
            raise ValueError(f"allocation {alloc.id} already holds GPUs")
        gpus = np.asarray(alloc.gpus, dtype=np.int64)
        if np.unique(gpus).size != gpus.size:
            raise ValueError(f"allocation {alloc.id}: a GPU is listed twice")
        if gpus.size and np.any(self.free[gpus] < alloc.milli):
            raise ValueError(f"allocation {alloc.id}: GPUs {alloc.gpus} are not free")
        if not restore and gpus.size and not np.all(self.gpu_ok[gpus]):
            raise ValueError(f"allocation {alloc.id}: GPUs {alloc.gpus} are not healthy")
        if not restore and gpus.size and np.any(self.node_exclusive[self.gpu_node[gpus]]):
            raise ValueError(f"allocation {alloc.id}: a node it asks for is held by an exclusive workload")
        host = self._host_of(alloc)
        if host is not None:
            assert self.cpu_free is not None and self.mem_free is not None
            nodes, cpu, mem = host
            if not restore and not self.host_fits(alloc):
                raise ValueError(f"allocation {alloc.id}: its nodes lack the CPU or memory it asks for")
            self.cpu_free[nodes] -= cpu
            self.mem_free[nodes] -= mem
        was_whole = (self.free[gpus] == FULL) & self.gpu_ok[gpus]
        self.free[gpus] -= alloc.milli
        self._adjust(gpus[was_whole], -1)
        if self.held and alloc.request.priority == "reserved":
            self._take_hold(alloc, gpus[was_whole])
        elif self.held and alloc.request.priority == "spot":
            self._count_spot(alloc, +1)
        if alloc.request.exclusive and gpus.size:
            nodes = np.unique(self.gpu_node[gpus])
            nodes = nodes[~self.node_exclusive[nodes]]
            self.whole_total -= int(self.node_whole[nodes][self.node_ok[nodes]].sum())
            self.node_exclusive[nodes] = True
        self.allocations[alloc.id] = alloc

    def _take_hold(self, alloc: Allocation, whole: NDArray[np.int64]) -> None:
        """A tenant's reserved work takes the whole GPUs it was placed on from its hold on their model."""
        took = []
        for m, n in self.per_model(whole):
            by = self.held.get(m)
            have = by.get(alloc.request.tenant, 0) if by else 0
            if have and by is not None:  # what it takes beyond its hold is not the plan's (placing refuses it)
                by[alloc.request.tenant] = have - min(have, n)
                took.append((m, min(have, n)))
        if took:
            self.hold_taken[alloc.id] = tuple(took)

    def unreserve(self, alloc_id: str) -> Allocation:
        alloc = self.allocations.pop(alloc_id)
        if self.held and alloc.request.priority == "spot":
            self._count_spot(alloc, -1)
        for model, n in self.hold_taken.pop(alloc_id, ()):
            by = self.held.setdefault(model, {})
            by[alloc.request.tenant] = by.get(alloc.request.tenant, 0) + n
        gpus = np.asarray(alloc.gpus, dtype=np.int64)
        if alloc.request.exclusive and gpus.size:
            nodes = np.unique(self.gpu_node[gpus])
            nodes = nodes[self.node_exclusive[nodes]]
            self.node_exclusive[nodes] = False
            self.whole_total += int(self.node_whole[nodes][self.node_ok[nodes]].sum())
        host = self._host_of(alloc)
        if host is not None:
            assert self.cpu_free is not None and self.mem_free is not None
            nodes, cpu, mem = host
            self.cpu_free[nodes] += cpu
            self.mem_free[nodes] += mem
        self.free[gpus] += alloc.milli
        now_whole = (self.free[gpus] == FULL) & self.gpu_ok[gpus]
        self._adjust(gpus[now_whole], +1)
        return alloc

    def _adjust(self, gpus: NDArray[np.int64], delta: int) -> None:
        if gpus.size == 0:
            return
        nodes = self.gpu_node[gpus]
        np.add.at(self.node_whole, nodes, delta)
        self.whole_total += delta * int(np.count_nonzero(self._counted(nodes)))

    # ---- health ----------------------------------------------------------------------------------
    def set_node_ok(self, node: int, ok: bool) -> None:
        """Drain (False) or return (True) a node; its running allocations are the caller's business."""
        if bool(self.node_ok[node]) != ok:
            self.node_ok[node] = ok
            if not self.node_exclusive[node]:
                self.whole_total += int(self.node_whole[node]) * (1 if ok else -1)

    def set_gpu_ok(self, gpu: int, ok: bool) -> None:
        self.gpu_ok[gpu] = ok
        self._recount()

    def holders(self, gpus: NDArray[np.int64] | list[int]) -> list[str]:
        wanted = set(int(g) for g in gpus)
        return [a.id for a in self.allocations.values() if wanted.intersection(a.gpus)]
