"""The scheduling loop's pass: snapshot the inventory, open allocations and the queue; run the `sched/` cycle
per cluster; persist what it decided.

The decisions come from the same pure `Scheduler` that `suanli sim` runs. This module only translates: node rows
and allocation rows into a `ClusterState`, pending workloads into `Request`s, and `Place`/`Preempt`/`Resize`/
`Pending` back into allocation rows and workload transitions (`control.scheduling.placing` and
`control.workloads.resizing`, which check admission again). Running elastic work is shown to the cycle as elastic (the
policy may grow or shrink it), unless its owner scaled it (`suanli scale`: then it is held at that size, after the pass
carried the owner's size out). What active plans reserve and their work leaves idle is held back from other work
(`control.scheduling.plan_holds`). Runtime estimates come from the spec and the org's finished jobs
(`control.scheduling.history`), as the simulator's come from the trace's. The inventory and open allocations are
read as `control.scheduling.snapshot` keeps them between passes.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select, update

from suanli.control.money import committed, plans
from suanli.control.scheduling import inventory, placing, quota_walk
from suanli.control.scheduling.clock import seconds
from suanli.control.scheduling.history import ServerHistory
from suanli.control.scheduling.plan_holds import PlanHolds
from suanli.control.scheduling.snapshot import ClusterView, Snapshot
from suanli.control.scheduling.waste import LiveWaste, live_waste
from suanli.control.workloads import resizing
from suanli.control.workloads.workloads import transition
from suanli.db.engine import Database
from suanli.db.models import KeyValue, Workload
from suanli.sched import Request, Scheduler, SchedulerConfig
from suanli.workloads.spec import WorkloadSpec


@dataclass
class PassReport:
    queued: int = 0
    placed: int = 0
    preempted: int = 0
    refused: int = 0  # placements admission refused (balance, quota)
    resized: int = 0  # running elastic work resized (by its owner's ask or the policy)
    cycle_s: float = 0.0
    total_s: float = 0.0
    live: LiveWaste | None = None  # None: the pass was skipped (nothing changed); the last one still holds


@dataclass
class SchedulingPass:
    """What one leader keeps between passes: the fleet's snapshot, parsed requests, and the scheduler (its memo
    caches key on request identity, so the same Request objects are reused)."""

    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    snapshot: Snapshot = field(default_factory=Snapshot)  # topologies and clusters' states, open allocations reserved
    requests: dict[tuple[str, int, float], Request] = field(default_factory=dict)
    hold_minutes: int = 10
    chunk: int = 200  # placements per transaction
    refresh_s: float = 30.0  # a pass runs at least this often while work is pending, even if nothing changed
    _views: list[ClusterView] = field(default_factory=list)
    _fleet: int = -1
    _signature: tuple[int, int] | None = None
    _last_run: datetime | None = None
    _rank: dict[str, int] = field(default_factory=dict)  # workload id -> its spec's priority rank
    _parsed: dict[str, WorkloadSpec] = field(default_factory=dict)  # workload id -> its spec (specs never change)
    _est_version: dict[tuple[str, int, float], int] = field(default_factory=dict)  # history version of its estimate
    _said: dict[str, tuple[str, int]] = field(default_factory=dict)
    _seen: int | None = None  # the inventory version the snapshot was last brought up to date at
    resizer: resizing.Resizer = field(default_factory=resizing.Resizer)  # running elastic work, between passes
    scheduler: Scheduler | None = None
    money: committed.Affordability = field(default_factory=committed.Affordability)
    history: ServerHistory = field(default_factory=ServerHistory)  # orgs' finished jobs, read incrementally

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(self.config)

    # ---- the pass ------------------------------------------------------------------------------------------
    def run(self, db: Database, now: datetime) -> PassReport:
        """One pass; skipped (cheaply) while neither the queue nor the inventory changed since the last one, except
        every `refresh_s` for what depends on time alone (waiting long enough to earn a reservation)."""
        t0 = time.perf_counter()
        report = PassReport()
        w = Workload
        with db.read() as s:
            fleet = inventory.fleet_version(s)
            if fleet != self._fleet or not self._views:
                self._views, self._fleet = self.snapshot.clusters(s), fleet
                self.snapshot.reset()  # node states changed: rebuild the snapshot
                self._seen = None
                self.resizer.reset()
            views = self._views
            version = s.scalar(select(KeyValue.value).where(KeyValue.key == inventory.INVENTORY_VERSION)) or 0
            queue_rows = list(s.execute(
                select(w.id, w.name, w.org_id, w.user_id, w.attempt, w.submitted_at, w.queued_at, w.attained_gpu_s)
                .where(w.state == "pending", w.stop_requested.is_(None)).order_by(w.queued_at, w.id)
            ))  # fmt: skip
            report.queued = len(queue_rows)
            reserved, plans_seen = plans.reservations(s, now), plans.version(s)
            # A top-up of an org whose work waits for balance is a change too, and so is a plan's start or end.
            signature = (version, hash(tuple((r.id, r.attempt, r.queued_at) for r in queue_rows)),
                         self.money.signature(s), PlanHolds(reserved.idle_by_org).signature())  # fmt: skip
            fresh = self._last_run is not None and (now - self._last_run).total_seconds() < self.refresh_s
            # Nothing queued, and no running elastic work the policy might grow (as of an up-to-date snapshot).
            idle = not queue_rows and self._seen == version and not self.resizer.any_elastic()
            if idle or (signature == self._signature and fresh):
                if not queue_rows:
                    report.live = LiveWaste()
                report.total_s = time.perf_counter() - t0
                return report
            self._signature, self._last_run = signature, now
            self.history.refresh(s, now, self._parsed)  # before any request is built: estimates read it
            unknown = [r.id for r in queue_rows if (r.id, r.attempt, seconds(r.queued_at)) not in self.requests]
            specs = placing.specs_of(s, unknown)
            self.money.read(s, {r.org_id for r in queue_rows}, {(r.org_id, r.user_id) for r in queue_rows}, now)
            limits = quota_walk.read(s, {r.org_id for r in queue_rows}, now)
            states = self.snapshot.update(s, views, self.requests, self.history, self.resizer)
            self._seen = version
            asks = self.resizer.pin(self.snapshot.states, self.snapshot.held, resizing.asked(s))
        if len(self.requests) > 2 * len(queue_rows) + 1000:
            live = {(r.id, r.attempt, seconds(r.queued_at)) for r in queue_rows}
            self.requests = {k: v for k, v in self.requests.items() if k in live}
            self._est_version = {k: v for k, v in self._est_version.items() if k in live}
            self._rank = {k[0]: self._rank[k[0]] for k in live if k[0] in self._rank}
            self._parsed = {k[0]: self._parsed[k[0]] for k in live if k[0] in self._parsed}
        queue, unreadable = [], {}
        for r in queue_rows:
            try:
                queue.append(self._request(r.id, r.attempt, r.submitted_at, r.queued_at, specs, r.org_id,
                                           r.attained_gpu_s))  # fmt: skip
            except ValueError as e:  # pydantic's ValidationError too: one workload's spec, never the whole pass
                unreadable[r.id] = f"its stored spec no longer reads back: {' '.join(str(e).split())[:500]}"
        if unreadable:
            self._fail(db, now, unreadable)
            queue_rows = [r for r in queue_rows if r.id not in unreadable]
        queue = self._by_priority(queue)
        # What each org runs and has queued counts against its balance: the work it cannot pay for waits unseen by the
        # cycle, which then never hands GPUs to work admission would refuse while others' work waits (`committed`).
        models = frozenset(m for v in views if v.topology is not None for m in v.models)
        users = {r.id: r.user_id for r in queue_rows}
        queue, broke = self.money.split(queue, self._parsed, models, self.hold_minutes, users)
        # Likewise its quotas and plans: work placement would refuse never takes GPUs, nor evicts others', in the cycle.
        queue, capped = quota_walk.within(queue, self._parsed, limits)
        broke = {**broke, **capped}
        placements: list[placing.Placement] = []
        preempts: list[tuple[str, str, str]] = []
        resizes: list[resizing.ResizeItem] = []
        waits: dict[str, str] = {}  # workload -> why the size its owner asked for waits
        pending: dict[str, tuple[str, int]] = {wid: (why, 0) for wid, why in broke.items()}
        left = list(queue)
        t1 = time.perf_counter()
        assert self.scheduler is not None
        topo = [v for v in views if v.topology is not None]
        holds = PlanHolds.over(reserved.idle_by_org, [states[v.row_id] for v in topo]) if reserved.idle_by_org else None
        for view in topo:
            mine = [r for r in left if r.gpus > 0 and _fits_models(r, view.models)]
            state = states[view.row_id]
            if holds is not None:
                holds.on(state)
            elif state.held:  # the last plan ended
                state.hold({})
            if asks.get(view.row_id):
                state = self.resizer.scale(self.scheduler, view, state, asks[view.row_id], resizes, waits)
            if not mine and state is states[view.row_id] and not self.resizer.growable(self.scheduler, view.row_id,
                                                                                        state):  # fmt: skip
                if holds is not None:
                    holds.after(state, None)
                continue
            result, decided = self.scheduler.cycle(state, mine, seconds(now))
            if holds is not None:
                holds.after(decided, result)
            placed = set()
            for p in result.placed:
                placements.append((p.request_id, view, resizing.by_node(view, p.gpus), p.reason))
                placed.add(p.request_id)
            for pr in result.preempted:
                preempts.append((pr.allocation_id, pr.reason, pr.by))
            resizes += [resizing.item(view, rz, state) for rz in result.resized]
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
        placed_ids, placed_gpus = {p[0] for p in placements}, Counter[str]()
        for _, view, where, _ in placements:
            placed_gpus[view.row_id] += sum(len(g) for g in where.values())
        for rz in resizes:
            placed_gpus[rz.view.row_id] += len(rz.gpus) - len(rz.held)
        report.live = live_waste(states, placed_gpus, [r for r in left if r.id not in placed_ids])
        self._persist(db, now, placements, preempts, resizes, waits, pending, report, plans_seen)
        report.total_s = time.perf_counter() - t0
        return report

    @staticmethod
    def _fail(db: Database, now: datetime, why: dict[str, str]) -> None:
        """Pending work whose spec cannot be read fails, with the reason, alone."""
        with db.write() as s, s.begin():
            q = select(Workload).where(Workload.id.in_(list(why)), Workload.state == "pending").with_for_update()
            for w in s.scalars(q):
                transition(s, w, "failed", why[w.id], now)

    def _request(self, wid: str, attempt: int, submitted_at: datetime, queued_at: datetime,
                 specs: dict[str, dict[str, Any]], org_id: str, attained: float) -> Request:  # fmt: skip
        key = (wid, attempt, seconds(queued_at))
        req = self.requests.get(key)
        if req is None:
            spec = WorkloadSpec.model_validate(specs[wid])
            req = spec.to_request(wid, seconds(submitted_at), org_id, attained=attained, queued_since=key[2])
            req = self.requests[key] = self.history.estimate(req, spec)
            self._est_version[key] = self.history.version(org_id)
            self._rank[wid] = spec.priority_rank()
            self._parsed[wid] = spec
        elif self.config.gittins and self._est_version.get(key) != self.history.version(org_id):
            req = self.requests[key] = self.history.estimate(req, self._parsed[wid])  # as `suanli sim` retakes them
            self._est_version[key] = self.history.version(org_id)
        return req

    def _by_priority(self, queue: list[Request]) -> list[Request]:
        """A spec's `priority` orders an org's own pending work: within each org, workloads asking the same GPUs
        trade places in the queue (the org keeps the submit times it holds), high before normal before low, so one
        org's priorities never move it ahead of another org's work. Places are traded only between equal asks: a
        place is worth what its work asks. An old gang that cannot start (a whole cluster's) handed to small work
        let that work start ahead of other orgs' earlier work; an old 1-GPU ticket, queued low and free while it
        waits, handed to a later 64-GPU gang let that gang take the next 64 free GPUs ahead of them."""
        by_ask: dict[tuple[str, int, int], list[Request]] = defaultdict(list)
        for r in queue:
            by_ask[(r.tenant, r.gpus, r.milli)].append(r)
        swap: dict[str, Request] = {}
        for reqs in by_ask.values():
            if len({self._rank.get(r.id, 1) for r in reqs}) < 2:
                continue  # one priority: nothing to reorder
            slots = sorted(r.submit_time for r in reqs)
            ordered = sorted(reqs, key=lambda r: (-self._rank.get(r.id, 1), r.submit_time, r.id))
            for slot, r in zip(slots, ordered, strict=True):
                if r.submit_time != slot:  # the place in the queue moves; how long it has waited does not
                    swap[r.id] = replace(r, submit_time=slot, queued_since=r.waiting_since)
        return [swap.get(r.id, r) for r in queue] if swap else queue

    # ---- persisting decisions -----------------------------------------------------------------------------
    def _persist(
        self,
        db: Database,
        now: datetime,
        placements: list[placing.Placement],
        preempts: list[tuple[str, str, str]],
        resizes: list[resizing.ResizeItem],
        waits: dict[str, str],
        pending: dict[str, tuple[str, int]],
        report: PassReport,
        plans_seen: int = 0,
    ) -> None:
        """Preemptions and resizes first (their GPUs are what later placements count on), then placements in chunks:
        each chunk is one transaction, so submissions (which need the write lock too on SQLite) wait for one chunk,
        not for a whole pass of thousands. A resize refused (a grow its org cannot afford) and a size its owner asked
        for that waits are said once in the workload's events. A plan bought since the snapshot (`plans_seen`) leaves
        the placements not yet written to the next pass, which holds its GPUs back."""
        if preempts:
            with db.write() as s, s.begin():
                report.preempted += placing.preempt(s, preempts, now)
        if resizes or waits:
            report.resized = self.resizer.persist(db, now, resizes, waits, self.hold_minutes, self._parsed)
        for i in range(0, len(placements), self.chunk):
            with db.write() as s, s.begin():
                if plans.locked_version(s) != plans_seen:  # until this commits, no purchase counts GPUs
                    break
                placed, refused = placing.place_chunk(s, placements[i : i + self.chunk], now,
                                                      hold_minutes=self.hold_minutes, cache=self._parsed,
                                                      lengths=self.resizer.lengths)  # fmt: skip
                if placed:
                    inventory.bump_version(s)
            report.placed += placed
            report.refused += len(refused)
            pending.update(refused)
        changed = [
            {"wid": wid, "r": r[:2000], "p": p} for wid, (r, p) in pending.items() if self._said.get(wid) != (r, p)
        ]
        self._said = dict(pending)  # what the rows say now: only changes are written next pass
        if changed:
            t = Workload.__table__.c
            with db.write() as s, s.begin():
                s.execute(
                    update(Workload.__table__)
                    .where(t.id == bindparam("wid"), t.state == "pending")
                    .values(pending_reason=bindparam("r"), queue_position=bindparam("p")),
                    changed,
                )


def _fits_models(r: Request, models: frozenset[str]) -> bool:
    if r.gpu_type is None:
        return True
    wanted = {r.gpu_type} if isinstance(r.gpu_type, str) else set(r.gpu_type)
    return bool(wanted & models)


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
