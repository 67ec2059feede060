"""What the scheduling pass reads the fleet as: node rows and engine clusters as `ClusterView`s, and each cluster's
`ClusterState` with every open allocation reserved (`Snapshot`), kept between passes and brought up to date from the
difference in open allocations. Allocations are shown to the cycle as the requests their workloads were queued as.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.control.scheduling import inventory, placing
from suanli.control.scheduling.clock import seconds
from suanli.control.scheduling.engines import ENGINE_KINDS, EXTERNAL_LABEL
from suanli.control.scheduling.history import ServerHistory
from suanli.control.workloads import resizing
from suanli.db.models import Allocation, ClusterRow, Gpu, Node, Workload
from suanli.sched import Allocation as SchedAllocation
from suanli.sched import ClusterState, Request, host_capacity
from suanli.topology import Cluster
from suanli.workloads.spec import WorkloadSpec

log = logging.getLogger("suanli.scheduling")


@dataclass
class ClusterView:
    row_id: str
    name: str
    topology: Cluster | None  # None: a CPU-only host
    nodes: list[tuple[str, str, str]]  # by spec index: (name, kind, state)
    models: frozenset[str]
    index: dict[str, int] = field(default_factory=dict)  # node name -> spec index
    unhealthy: list[tuple[str, int]] = field(default_factory=list)  # (node name, GPU index) health rules marked
    host: tuple[Any, Any] | None = None  # per node (milli-cores, MiB) to count requests' CPU and memory against

    def __post_init__(self) -> None:
        self.index = {name: i for i, (name, _, _) in enumerate(self.nodes)}

    def node_of(self, gpu: int) -> int:
        assert self.topology is not None
        return int(self.topology.gpu_node[gpu])


def external_gpus(s: Session) -> dict[str, list[tuple[str, int]]]:
    """GPUs of engine nodes that work outside suanli holds (Slurm jobs submitted to Slurm directly), by cluster:
    the engine reports how many, so that many of the node's GPUs no suanli allocation holds are not placed on."""
    busy = [(cid, name, int(labels.get(EXTERNAL_LABEL) or 0), n)
            for cid, name, labels, n in s.execute(select(Node.cluster_id, Node.name, Node.labels, Node.gpu_count)
                                                  .where(Node.kind.in_(ENGINE_KINDS)))
            if int((labels or {}).get(EXTERNAL_LABEL) or 0) > 0]  # fmt: skip
    if not busy:
        return {}
    held: dict[str, set[int]] = defaultdict(set)
    for (placement,) in s.execute(select(Allocation.placement).where(Allocation.stopped_at.is_(None))):
        for node, gpus in (placement or {}).items():
            held[node].update(int(g) for g in gpus)
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for cid, name, k, n in busy:
        free = [g for g in range(n - 1, -1, -1) if g not in held[name]]
        out[cid].extend((name, g) for g in free[:k])
    return out


@dataclass
class Snapshot:
    """What one leader keeps of the fleet between passes: topologies (immutable once registered) and each cluster's
    state with every open allocation reserved."""

    topologies: dict[tuple[str, str], Cluster | None] = field(default_factory=dict)  # by `topology_key`
    states: dict[str, ClusterState] = field(default_factory=dict)  # by cluster row id, open allocations reserved
    held: dict[str, tuple[str, str]] = field(default_factory=dict)  # allocation row id -> (cluster, sched id)

    def clusters(self, s: Session) -> list[ClusterView]:
        nodes: dict[str, list[tuple[int, str, str, str, str | None, int, int]]] = defaultdict(list)
        for cid, idx, name, kind, state, model, cpus, mem in s.execute(
            select(Node.cluster_id, Node.index, Node.name, Node.kind, Node.state, Node.gpu_model, Node.cpu_count,
                   Node.memory_mib)
        ):  # fmt: skip
            nodes[cid].append((idx, name, kind, state, model, cpus, mem))
        unhealthy: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for cid, name, gpu in s.execute(
            select(Node.cluster_id, Node.name, Gpu.index)
            .join(Gpu, Gpu.node_id == Node.id)
            .where(Gpu.healthy.is_(False))
        ):
            unhealthy[cid].append((name, gpu))
        for cid, gpus in external_gpus(s).items():
            unhealthy[cid].extend(gpus)
        views = []
        for row in s.scalars(select(ClusterRow).order_by(ClusterRow.created_at)):
            key = inventory.topology_key(row)
            if key not in self.topologies:
                self.topologies[key] = inventory.cluster_topology(row)
            rows = sorted(nodes.get(row.id, []))
            models = frozenset(r[4] for r in rows if r[4])
            topo = self.topologies[key]
            fits = topo is not None and len(rows) == topo.n_nodes
            host = host_capacity([r[5] for r in rows], [r[6] for r in rows]) if fits else None
            views.append(ClusterView(row.id, row.name, topo,
                                     [(r[1], r[2], r[3]) for r in rows], models,
                                     unhealthy=unhealthy.get(row.id, []), host=host))  # fmt: skip
        return views

    def reset(self) -> None:
        """Node states changed: the next `update` rebuilds every cluster's state."""
        self.states, self.held = {}, {}

    def update(
        self,
        s: Session,
        views: list[ClusterView],
        requests: dict[tuple[str, int, float], Request],
        history: ServerHistory,
        resizer: resizing.Resizer,
    ) -> dict[str, ClusterState]:
        """Each cluster's state with every open allocation reserved, kept between passes and brought up to date
        from the difference in open allocations: a pass reads the ids of open allocations, and the rows of only
        those opened since the last pass (thousands of running gangs are not re-read and re-reserved each pass).
        `requests` are the pass's, by (workload, attempt, queued at)."""
        if not self.states:
            for v in views:
                if v.topology is None:
                    continue
                st = ClusterState(v.topology, host=v.host)
                for i, (_, _, state) in enumerate(v.nodes):
                    if state != "ready":
                        st.set_node_ok(i, False)
                for name, gpu in v.unhealthy:
                    if name in v.index and gpu < len(v.topology.gpus_of_node(v.index[name])):
                        st.set_gpu_ok(v.topology.gpus_of_node(v.index[name]).start + gpu, False)
                self.states[v.row_id] = st
        open_ids = set(s.scalars(select(Allocation.id).where(Allocation.stopped_at.is_(None))))
        for aid in [a for a in self.held if a not in open_ids]:
            cid, sched_id = self.held.pop(aid)
            if sched_id in self.states[cid].allocations:
                self.states[cid].unreserve(sched_id)
                resizer.forget(cid, sched_id)
        new = [a for a in open_ids if a not in self.held]
        where = {name: (v.row_id, i) for v in views if v.topology is not None for i, (name, _, _) in enumerate(v.nodes)}
        w = Workload
        for i in range(0, len(new), 500):
            rows = s.execute(
                select(Allocation.id, Allocation.workload, Allocation.placement, Allocation.milli, Allocation.started_at,
                       w.org_id, w.submitted_at, w.queued_at, w.attempt, w.scale_to, w.started_at.label("run_start"))
                .outerjoin(w, w.id == Allocation.workload).where(Allocation.id.in_(new[i : i + 500]))
            ).all()  # fmt: skip
            # In the order they were placed or resized (the cycle's own order: its grow goes oldest first).
            rows.sort(key=lambda a: (a.started_at, a.submitted_at or a.started_at, a.id))
            # Most were placed by the last pass: their requests are cached; only the others' specs are read.
            uncached = [a.workload for a in rows if a.workload and _cached(a, requests) is None]
            specs = placing.specs_of(s, uncached) if uncached else {}
            for a in rows:
                self._reserve(a, where, specs, requests, history, resizer)
        return self.states

    def _reserve(
        self,
        a: Any,
        where: dict[str, tuple[str, int]],
        specs: dict[str, dict[str, Any]],
        requests: dict[tuple[str, int, float], Request],
        history: ServerHistory,
        resizer: resizing.Resizer,
    ) -> None:
        gpus: list[int] = []
        cid = None
        for node_name, idx in (a.placement or {}).items():
            if node_name not in where:
                continue
            cid, i = where[node_name]
            base = self.states[cid].cluster.gpus_of_node(i).start
            gpus.extend(base + int(k) for k in idx)
        if cid is None or not gpus:
            return
        cached = _cached(a, requests)
        if cached is not None:
            req = replace(cached, attained=0.0) if cached.attained else cached
        elif a.workload in specs:
            spec = WorkloadSpec.model_validate(specs[a.workload])
            req = spec.to_request(a.workload, seconds(a.submitted_at), a.org_id, queued_since=seconds(a.queued_at))
            req = history.estimate(req, spec)
        else:  # an allocation no workload owns (opened through the API directly)
            req = Request(a.id, len(gpus), seconds(a.started_at), milli=a.milli)
        sched_id = a.workload or a.id
        if req.elastic:
            resizer.asked[sched_id] = req
        if (req.elastic and a.scale_to is not None) or (not req.elastic and req.gpus != len(gpus)):
            # Work its owner scaled is held at its size (the cycle must neither grow nor shrink it); running elastic
            # work is the cycle's to resize (the pass carries that out), at its CPU and memory per GPU of its ask.
            req = resizing.pinned(req, len(gpus))
        # A resized run keeps its start (the cycle's grow goes oldest first, LAS counts its service from it).
        run = a.run_start if a.run_start is not None and a.run_start < a.started_at else a.started_at
        est = req.est_runtime
        alloc = SchedAllocation(sched_id, req, tuple(gpus), seconds(run), a.milli, seconds(run) + est if est else None)
        try:  # it holds them already: an unhealthy GPU or an exclusive neighbour does not undo that
            self.states[cid].reserve(alloc, restore=True)
        except ValueError as e:  # overlapping rows (a preempted attempt still closing): skip, never crash
            log.warning("snapshot: %s", e)
            return
        self.held[a.id] = (cid, sched_id)
        if req.elastic:
            resizer.elastic[cid].add(sched_id)


def _cached(a: Any, requests: dict[tuple[str, int, float], Request]) -> Request | None:
    """The request a pass queued this allocation's workload as: keyed by the attempt before its placement
    (placing counts the attempt up)."""
    if a.queued_at is None:
        return None
    return requests.get((a.workload, a.attempt - 1, seconds(a.queued_at)))
