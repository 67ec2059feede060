"""The scheduling loop's pass: snapshot the inventory, open allocations and the queue; run the `sched/` cycle
per cluster; persist what it decided.

The decisions come from the same pure `Scheduler` that `suanli sim` runs. This module only translates: node rows
and allocation rows into a `ClusterState`, pending workloads into `Request`s, and `Place`/`Preempt`/`Pending`
back into allocation rows (admission checked again, under the org's row lock) and workload transitions. One
placement that fails admission (balance, quota) rolls back alone, in its own savepoint.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from suanli.billing.money import ZERO
from suanli.control import inventory, metering, workloads
from suanli.control.errors import ServiceError
from suanli.db.engine import Database
from suanli.db.models import Allocation, ClusterRow, Node, Workload
from suanli.sched import Allocation as SchedAllocation
from suanli.sched import ClusterState, Request, Scheduler, SchedulerConfig
from suanli.topology import Cluster
from suanli.workloads.spec import WorkloadSpec

log = logging.getLogger("suanli.scheduling")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def seconds(t: datetime) -> float:
    return (t - EPOCH).total_seconds()


@dataclass
class ClusterView:
    row_id: str
    name: str
    topology: Cluster | None  # None: a CPU-only host
    nodes: list[tuple[str, str, str]]  # by spec index: (name, kind, state)
    models: frozenset[str]

    def node_of(self, gpu: int) -> int:
        assert self.topology is not None
        return int(self.topology.gpu_node[gpu])


@dataclass
class PassReport:
    queued: int = 0
    placed: int = 0
    preempted: int = 0
    refused: int = 0  # placements admission refused (balance, quota)
    cycle_s: float = 0.0
    total_s: float = 0.0


@dataclass
class SchedulingPass:
    """What one leader keeps between passes: topologies (immutable once registered), parsed requests, and the
    scheduler (its memo caches key on request identity, so the same Request objects are reused)."""

    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    topologies: dict[str, Cluster | None] = field(default_factory=dict)
    requests: dict[tuple[str, int, float], Request] = field(default_factory=dict)
    hold_minutes: int = 10
    scheduler: Scheduler | None = None

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(self.config)

    # ---- snapshot ----------------------------------------------------------------------------------------
    def _clusters(self, s: Session) -> list[ClusterView]:
        nodes: dict[str, list[tuple[int, str, str, str, str | None]]] = defaultdict(list)
        for cid, idx, name, kind, state, model in s.execute(
            select(Node.cluster_id, Node.index, Node.name, Node.kind, Node.state, Node.gpu_model)
        ):
            nodes[cid].append((idx, name, kind, state, model))
        views = []
        for row in s.scalars(select(ClusterRow).order_by(ClusterRow.created_at)):
            if row.id not in self.topologies:
                self.topologies[row.id] = inventory.cluster_topology(row)
            rows = sorted(nodes.get(row.id, []))
            models = frozenset(m for *_, m in rows if m)
            views.append(ClusterView(row.id, row.name, self.topologies[row.id],
                                     [(n, k, st) for _, n, k, st, _ in rows], models))  # fmt: skip
        return views

    # ---- the pass ------------------------------------------------------------------------------------------
    def run(self, db: Database, now: datetime) -> PassReport:
        t0 = time.perf_counter()
        report = PassReport()
        with db.read() as s:
            views = self._clusters(s)
            queue_rows = list(
                s.execute(
                    select(Workload.id, Workload.org_id, Workload.attempt, Workload.queued_at, Workload.spec,
                           Workload.attained_gpu_s)
                    .where(Workload.state == "pending", Workload.stop_requested.is_(None))
                    .order_by(Workload.queued_at)
                )
            )  # fmt: skip
            running = list(
                s.execute(
                    select(Allocation.id, Allocation.workload, Allocation.placement, Allocation.milli,
                           Allocation.started_at, Workload.spec, Workload.org_id, Workload.attempt,
                           Workload.queued_at)
                    .outerjoin(Workload, Workload.id == Allocation.workload)
                    .where(Allocation.stopped_at.is_(None))
                )
            )  # fmt: skip
        live = {(r.id, r.attempt, seconds(r.queued_at)) for r in queue_rows}
        live |= {(r.workload, r.attempt, seconds(r.queued_at)) for r in running if r.queued_at is not None}
        if len(self.requests) > 2 * len(live) + 1000:
            self.requests = {k: v for k, v in self.requests.items() if k in live}
        queue = [self._req(r) for r in queue_rows]
        report.queued = len(queue)
        if not queue:
            report.total_s = time.perf_counter() - t0
            return report
        states = self._states(views, running, now)
        placements: list[tuple[str, ClusterView, dict[str, list[int]], str]] = []
        preempts: list[tuple[str, str]] = []
        pending: dict[str, tuple[str, int]] = {}
        left = list(queue)
        t1 = time.perf_counter()
        for view in views:
            if view.topology is None or not left:
                continue
            mine = [r for r in left if r.gpus > 0 and _fits_models(r, view.models)]
            if not mine:
                continue
            result, _ = self.scheduler.cycle(states[view.row_id], mine, seconds(now))  # type: ignore[union-attr]
            placed = set()
            for p in result.placed:
                placements.append((p.request_id, view, _placement(view, p.gpus), p.reason))
                placed.add(p.request_id)
            for pr in result.preempted:
                preempts.append((pr.allocation_id, pr.reason))
            for pe in result.pending:
                pending.setdefault(pe.request_id, (pe.reason, pe.position))
            left = [r for r in left if r.id not in placed]
        for r in left:  # CPU-only work goes to a node of its own kind: this host first
            if r.gpus == 0:
                target = _cpu_node(views)
                if target is not None:
                    view, name = target
                    placements.append((r.id, view, {name: []}, "CPU-only"))
                    pending.pop(r.id, None)
                else:
                    pending[r.id] = ("no ready node to run it on", 0)
            elif r.id not in pending:
                pending[r.id] = (_unmatched_reason(r, views), 0)
        report.cycle_s = time.perf_counter() - t1
        self._persist(db, now, placements, preempts, pending, report)
        report.total_s = time.perf_counter() - t0
        return report

    def _request(self, wid: str, attempt: int, queued_at: datetime, spec: dict[str, Any], org_id: str,
                 attained: float) -> Request:  # fmt: skip
        key = (wid, attempt, seconds(queued_at))
        req = self.requests.get(key)
        if req is None:
            req = WorkloadSpec.model_validate(spec).to_request(wid, key[2], org_id, attained=attained)
            self.requests[key] = req
        return req

    def _req(self, row: Any) -> Request:
        return self._request(row.id, row.attempt, row.queued_at, row.spec, row.org_id, row.attained_gpu_s)

    def _states(self, views: list[ClusterView], running: list[Any], now: datetime) -> dict[str, ClusterState]:
        states: dict[str, ClusterState] = {}
        where: dict[str, tuple[str, int]] = {}
        for v in views:
            if v.topology is None:
                continue
            st = ClusterState(v.topology)
            for i, (name, _, state) in enumerate(v.nodes):
                where[name] = (v.row_id, i)
                if state != "ready":
                    st.set_node_ok(i, False)
            states[v.row_id] = st
        topo = {v.row_id: v.topology for v in views}
        for a in running:
            gpus: list[int] = []
            cid = None
            for node_name, idx in (a.placement or {}).items():
                if node_name not in where:
                    continue
                cid, i = where[node_name]
                base = topo[cid].gpus_of_node(i).start  # type: ignore[union-attr]
                gpus.extend(base + int(k) for k in idx)
            if cid is None or not gpus:
                continue
            if a.spec is not None:
                req = self._request(a.workload, a.attempt, a.queued_at, a.spec, a.org_id, 0.0)
            else:
                req = Request(a.id, len(gpus), seconds(a.started_at), milli=a.milli)
            est = req.est_runtime
            alloc = SchedAllocation(a.workload or a.id, req, tuple(gpus), seconds(a.started_at), a.milli,
                                    seconds(a.started_at) + est if est else None)  # fmt: skip
            try:
                states[cid].reserve(alloc)
            except ValueError as e:  # overlapping rows (a preempted attempt still closing): skip, never crash
                log.warning("snapshot: %s", e)
        return states

    # ---- persisting decisions -----------------------------------------------------------------------------
    def _persist(
        self,
        db: Database,
        now: datetime,
        placements: list[tuple[str, ClusterView, dict[str, list[int]], str]],
        preempts: list[tuple[str, str]],
        pending: dict[str, tuple[str, int]],
        report: PassReport,
    ) -> None:
        with db.write() as s, s.begin():
            for wid, reason in preempts:
                w = s.get(Workload, wid, with_for_update=True, populate_existing=True)
                if w is None or w.state not in ("scheduled", "starting", "running") or w.stop_requested:
                    continue
                if w.allocation_id is not None:  # billing ends when the scheduler takes the GPUs back
                    metering.close_allocation(s, w.allocation_id, now)
                w.stop_requested = reason
                workloads.event(s, w, f"preemption: {reason}", now)
                report.preempted += 1
            for wid, view, placement, reason in placements:
                try:
                    with s.begin_nested():
                        if self._place(s, wid, view, placement, reason, now):
                            report.placed += 1
                except ServiceError as e:
                    report.refused += 1
                    pending[wid] = (f"cannot start yet: {e.message}", 0)
            changed = [{"wid": wid, "r": r[:2000], "p": p} for wid, (r, p) in pending.items()]
            if changed:
                t = Workload.__table__.c
                s.execute(
                    update(Workload.__table__)
                    .where(t.id == bindparam("wid"), t.state == "pending")
                    .values(pending_reason=bindparam("r"), queue_position=bindparam("p")),
                    changed,
                )

    def _place(
        self, s: Session, wid: str, view: ClusterView, placement: dict[str, list[int]], reason: str, now: datetime
    ) -> bool:
        w = s.get(Workload, wid, with_for_update=True, populate_existing=True)
        if w is None or w.state != "pending" or w.stop_requested:
            return False
        spec = WorkloadSpec.model_validate(w.spec)
        names = list(placement)
        index = {n: i for i, (n, _, _) in enumerate(view.nodes)}
        kind = view.nodes[index[names[0]]][1]
        gpu_model = None
        gpus = sum(len(v) for v in placement.values())
        if gpus and view.topology is not None:
            gpu_model = view.topology.group_of(index[names[0]]).gpu.name
        attempt = w.attempt + 1
        plan = spec.plan_id()
        alloc = metering.open_allocation(
            s, org_id=w.org_id, user_id=w.user_id, workload=w.id, gpu_model=gpu_model, gpus=gpus,
            placement=placement, now=now, hold_minutes=self.hold_minutes, milli=spec.milli(),
            mode="plan" if plan else spec.billing_mode(), allocation_id=f"{w.id}.{attempt}",
            rate=ZERO if plan else None,
        )  # fmt: skip
        w.attempt, w.allocation_id, w.executor = attempt, alloc.id, kind
        where = ", ".join(f"{n}[{','.join(map(str, g))}]" if g else n for n, g in list(placement.items())[:8])
        more = f" and {len(placement) - 8} more nodes" if len(placement) > 8 else ""
        what = f"{gpus} x {gpu_model}" if gpu_model else "no GPUs"
        workloads.transition(s, w, "scheduled", f"placed: {what} on {where}{more}" + (f" ({reason})" if reason else ""),
                             now)  # fmt: skip
        return True


def _fits_models(r: Request, models: frozenset[str]) -> bool:
    if r.gpu_type is None:
        return True
    wanted = {r.gpu_type} if isinstance(r.gpu_type, str) else set(r.gpu_type)
    return bool(wanted & models)


def _placement(view: ClusterView, gpus: tuple[int, ...]) -> dict[str, list[int]]:
    assert view.topology is not None
    out: dict[str, list[int]] = {}
    for g in sorted(gpus):
        i = view.node_of(g)
        out.setdefault(view.nodes[i][0], []).append(g - view.topology.gpus_of_node(i).start)
    return out


def _cpu_node(views: list[ClusterView]) -> tuple[ClusterView, str] | None:
    ranked = sorted(
        ((0 if kind == "local" else 1, vi, name) for vi, v in enumerate(views)
         for name, kind, state in v.nodes if state == "ready"),
    )  # fmt: skip
    if not ranked:
        return None
    _, vi, name = ranked[0]
    return views[vi], name


def _unmatched_reason(r: Request, views: list[ClusterView]) -> str:
    models = sorted({m for v in views for m in v.models})
    want = r.gpu_type if isinstance(r.gpu_type, str) else " or ".join(r.gpu_type or ("any GPU",))
    return f"no ready node has {want}; GPUs registered: {', '.join(models) or 'none'}"
