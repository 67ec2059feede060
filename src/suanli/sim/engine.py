"""Discrete-event replay of a trace through the very scheduler the server runs.

Events: arrivals, finishes, node failures and repairs (exponential MTBF/MTTR). After the events of one
instant the scheduler runs a cycle on the current state and its decisions are applied: placements start
jobs at a rate set by `RuntimeModel` (a scattered gang runs slower), preemptions stop them (progress kept,
a restart penalty added), resizes change an elastic job's GPUs and speed. Time is simulated; the only
wall clock is an optional `clock` callable the caller injects to measure decision latency.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from suanli.sched import ClusterState, Request, Scheduler, SchedulerConfig, cluster_host
from suanli.sched.estimates import RuntimeHistory, for_request
from suanli.sched.scaling import ScalingModel
from suanli.sched.types import FULL, ModelHint
from suanli.sim.metrics import JobRecord, MetricsRecorder, SimResult
from suanli.sim.oracle import OracleScheduler, is_oracle
from suanli.sim.runtime import RuntimeModel
from suanli.sim.workload import TraceJob
from suanli.topology.model import Cluster

ARRIVAL, FINISH, FAIL, REPAIR = 0, 1, 2, 3


@dataclass(frozen=True)
class SimConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    restart_penalty_s: float = 60.0  # work redone after a preemption or failure (checkpoint interval / 2)
    resize_penalty_s: float = 30.0  # an elastic resize restarts from an in-memory checkpoint
    node_mtbf_h: float | None = None  # per-node mean time between failures; None: no failures
    mttr_h: float = 4.0
    seed: int = 0
    use_estimates: bool = True  # give the scheduler runtime estimates (from `estimates`)
    estimates: str = "history"  # "history": the tenant's finished work so far (what the server knows); "exact": the
    # trace duration (clairvoyant, for comparison only)
    est_samples: bool = True  # with "history": hand the scheduler the similar work's run times, not only their median


@dataclass
class _Running:
    gpus: np.ndarray
    rate: float  # reference-seconds of work per second
    since: float
    epoch: int
    slow: float = 1.0  # placement slowdown (rate = speed / slow)


class Simulation:
    def __init__(self, jobs: Sequence[TraceJob], cluster: Cluster, config: SimConfig | None = None) -> None:
        self.jobs = list(jobs)
        self.cluster = cluster
        self.config = config or SimConfig()
        self.remaining = [j.duration_s for j in self.jobs]
        self.scheduler: Scheduler | OracleScheduler = (
            OracleScheduler(self.remaining)
            if is_oracle(self.config.scheduler.policy)
            else Scheduler(self.config.scheduler)
        )
        self.state = ClusterState(cluster, host=cluster_host(cluster))
        self.runtime = RuntimeModel(cluster)
        self.scaling = ScalingModel(cluster)
        types = {g.gpu.name for g in cluster.groups} | {g.name for g in cluster.groups}
        self.requests = [self._request(i, j, types) for i, j in enumerate(self.jobs)]
        self.attained = [0.0] * len(self.jobs)
        self.running: dict[int, _Running] = {}
        self.elastic_running: set[int] = set()  # running elastic jobs: an empty queue may still let them grow
        self.queue: dict[int, Request] = {}
        self.epoch = [0] * len(self.jobs)
        self.records = [JobRecord(j.job_id, j.tenant, j.submit_time_s, j.duration_s, j.num_gpus) for j in self.jobs]
        self.metrics = MetricsRecorder(cluster.n_gpus)
        self.rng = np.random.default_rng(self.config.seed)
        wants_history = self.config.use_estimates and self.config.estimates == "history"
        self.history = RuntimeHistory() if wants_history else None
        if self.config.estimates not in ("history", "exact"):
            raise ValueError(f"estimates must be 'history' or 'exact', not {self.config.estimates!r}")
        self.events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.est_version: dict[int, int] = {}  # the tenant's history version each job's estimate was taken at
        self.refresh_estimates = self.history is not None and self.config.scheduler.gittins

    # ---- setup ------------------------------------------------------------------------------------
    def _request(self, i: int, j: TraceJob, types: set[str]) -> Request:
        # a trace may name several acceptable models ("V100M16|V100M32"); keep those this cluster has
        wanted = tuple(t for t in (j.gpu_type or "").split("|") if t in types)
        gpu_type = wanted[0] if len(wanted) == 1 else (wanted or None)
        milli = round(j.gpu_fraction * FULL) if j.gpu_fraction < 1.0 else FULL
        elastic = j.min_gpus is not None and j.max_gpus is not None and j.min_gpus < j.max_gpus
        return Request(
            id=str(i),
            gpus=j.num_gpus,
            submit_time=j.submit_time_s,
            tenant=j.tenant,
            gpu_type=gpu_type,
            milli=max(1, milli),
            min_gpus=min(j.min_gpus, j.num_gpus) if elastic and j.min_gpus else None,
            max_gpus=max(j.max_gpus, j.num_gpus) if elastic and j.max_gpus else None,
            priority=j.priority,
            est_runtime=j.duration_s if self.config.use_estimates and self.config.estimates == "exact" else None,
            model=ModelHint(preset=j.model) if j.model else None,
            cpu_milli=j.cpu_milli,
            memory_mib=j.memory_mib,
        )

    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, a, b))

    # ---- run --------------------------------------------------------------------------------------
    def run(
        self, clock: Callable[[], float] | None = None, progress: Callable[[int, int], None] | None = None
    ) -> SimResult:
        wall0 = clock() if clock else 0.0
        rooms: dict[object, int] = {}
        for i, j in enumerate(self.jobs):
            req = self.requests[i]
            if req.gpu_type not in rooms:
                usable = self.state.usable_nodes(req.gpu_type)
                rooms[req.gpu_type] = int(self.state.gpn[usable].sum())
            room = rooms[req.gpu_type]
            host_room = self.state.host_room(req)  # the GPUs the nodes' cores and memory could carry, all free
            if host_room is not None:
                usable = self.state.usable_nodes(req.gpu_type)
                room = min(room, int(host_room[usable].sum()))
            if (req.min_gpus or j.num_gpus) > room:
                self.records[i].unschedulable = True
                continue
            self._push(j.submit_time_s, ARRIVAL, i)
        if self.config.node_mtbf_h:
            for n in range(self.cluster.n_nodes):
                self._push(self.rng.exponential(self.config.node_mtbf_h * 3600.0), FAIL, n)
        done = 0
        total = sum(1 for r in self.records if not r.unschedulable)
        now = 0.0
        while self.events:
            head = self.events[0]
            if head[2] == FINISH and (head[4] != self.epoch[head[3]] or head[3] not in self.running):
                heapq.heappop(self.events)  # superseded by a preemption or resize: not an event at all
                continue
            t = head[0]
            only_faults = not self.running and self.events[0][2] in (FAIL, REPAIR)
            stuck = only_faults and (not self.queue or bool(self.state.node_ok.all()))
            if stuck and all(e[2] in (FAIL, REPAIR) for e in self.events):
                break  # only failures left, and nothing queued could start even on a healthy cluster
            self._advance(now, t)
            now = t
            changed = False
            while self.events and self.events[0][0] == t:
                _, _, kind, a, b = heapq.heappop(self.events)
                if kind == ARRIVAL:
                    if self.history is not None:
                        self._estimate(a)
                    self.queue[a] = self.requests[a]
                    changed = True
                elif kind == FINISH and b == self.epoch[a] and a in self.running:
                    self._finish(a, t)
                    done += 1
                    changed = True
                    if progress and done % 500 == 0:
                        progress(done, total)
                elif kind == FAIL:
                    self._fail(a, t)
                    changed = True
                elif kind == REPAIR:
                    self._repair(a, t)
                    changed = True
            elastic_idle = self.scheduler.policy.elastic and self.elastic_running and self.state.free_whole_gpus() > 0
            if changed and (self.queue or elastic_idle):
                self._schedule(t, clock)
        self._advance(now, now)
        if progress:
            progress(done, total)
        wall = (clock() - wall0) if clock else 0.0
        done = [(j.gpu_seconds - (0.0 if r.finish is not None else self._left(i))) for i, (j, r) in
                enumerate(zip(self.jobs, self.records, strict=True)) if not r.unschedulable]  # fmt: skip
        self.metrics.work_gpu_s = float(sum(max(0.0, w) for w in done))
        return self.metrics.result(self.records, now, wall, queued=len(self.queue), running=len(self.running))

    def _estimate(self, i: int) -> None:
        """Job i's request with its estimate from its tenant's history now (what the server asks, too)."""
        assert self.history is not None
        j = self.jobs[i]
        est, samples = for_request(self.history, j.tenant, j.model, j.num_gpus, with_samples=self.config.est_samples)
        self.est_version[i] = self.history.version(j.tenant)
        if est != self.requests[i].est_runtime or samples != self.requests[i].est_samples:
            self.requests[i] = replace(self.requests[i], est_runtime=est, est_samples=samples)
            if i in self.queue:
                self.queue[i] = self.requests[i]

    def _refresh_estimates(self) -> None:
        """Queued work's estimates follow its tenant's history as it grows (the Gittins order must see the latest
        finishers, not only those before the job arrived)."""
        assert self.history is not None
        for i in self.queue:
            if self.est_version.get(i) != self.history.version(self.jobs[i].tenant):
                self._estimate(i)

    def _left(self, i: int) -> float:
        """Recorded work of job i not done yet (GPU-seconds of the reference placement)."""
        j = self.jobs[i]
        return min(self.remaining[i], j.duration_s) * j.num_gpus * j.gpu_fraction

    # ---- transitions ------------------------------------------------------------------------------
    def _advance(self, t0: float, t1: float) -> None:
        dt = t1 - t0
        if dt <= 0:
            return
        self.metrics.interval(dt, self.state, self.queue, self.running, self.requests)

    def _progress(self, i: int, t: float) -> None:
        run = self.running[i]
        work = (t - run.since) * run.rate
        self.remaining[i] = max(0.0, self.remaining[i] - work)
        self.attained[i] += (t - run.since) * run.gpus.size * self.requests[i].milli / FULL
        run.since = t

    def _start(self, i: int, gpus: np.ndarray, t: float) -> None:
        req = self.requests[i]
        slow = self.runtime.slowdown(gpus, req.model.preset if req.model else None) if req.milli == FULL else 1.0
        speed = self._elastic_speed(i, gpus.size)
        self.epoch[i] += 1
        self.running[i] = _Running(gpus, speed / slow, t, self.epoch[i], slow)
        if req.elastic:
            self.elastic_running.add(i)
        rec = self.records[i]
        if rec.first_start is None:
            rec.first_start = t
        rec.slowdowns.append(slow)
        self._push(t + self.remaining[i] / self.running[i].rate, FINISH, i, self.epoch[i])

    def _elastic_speed(self, i: int, n: int) -> float:
        """Throughput at n GPUs relative to the requested count, from the same scaling model the
        elastic policy decides with."""
        asked = self.jobs[i].num_gpus
        if n == asked or asked == 0:
            return 1.0
        return self.scaling.speedup(n, asked, self.jobs[i].model)

    def _stop(self, i: int, t: float, *, preempted: bool) -> None:
        """Requeue a running job with its progress, plus the restart penalty (preemption or failure)."""
        self._progress(i, t)
        del self.running[i]
        self.elastic_running.discard(i)
        self.epoch[i] += 1
        redo = min(self.config.restart_penalty_s, self.jobs[i].duration_s)
        self.remaining[i] += redo
        self.metrics.redone(self.requests[i], redo, "preemption" if preempted else "failure")
        if preempted:
            self.records[i].preemptions += 1
        self.requests[i] = replace(self.requests[i], attained=self.attained[i], queued_since=t)
        self.metrics.requeued_now += self.requests[i].gpus * self.requests[i].milli / FULL
        self.queue[i] = self.requests[i]

    def _finish(self, i: int, t: float) -> None:
        del self.running[i]
        self.elastic_running.discard(i)
        self.state.unreserve(str(i))
        self.records[i].finish = t
        if self.history is not None:  # what the server's history knows: the work's run time, as recorded
            j = self.jobs[i]
            self.history.record(j.tenant, j.model, j.num_gpus, j.duration_s)

    def _fail(self, node: int, t: float) -> None:
        self.state.set_node_ok(node, False)
        victims = self.state.holders(list(self.cluster.gpus_of_node(node)))
        for aid in victims:
            i = int(aid)
            self.state.unreserve(aid)
            self._stop(i, t, preempted=False)
            self.records[i].failures += 1
        self.metrics.failures += 1
        self._push(t + self.rng.exponential(self.config.mttr_h * 3600.0), REPAIR, node)

    def _repair(self, node: int, t: float) -> None:
        self.state.set_node_ok(node, True)
        if self.config.node_mtbf_h:
            self._push(t + self.rng.exponential(self.config.node_mtbf_h * 3600.0), FAIL, node)

    def _schedule(self, t: float, clock: Callable[[], float] | None) -> None:
        """Run cycles at this instant until nothing is freed: a preempted or shrunk job's GPUs, and the
        victim itself, get a fresh look at once rather than at the next event."""
        for _ in range(1 if isinstance(self.scheduler, OracleScheduler) else 4):  # the oracle repacks all at once
            if not self._cycle(t, clock) or not self.queue:
                break

    def _cycle(self, t: float, clock: Callable[[], float] | None) -> bool:
        for i in self.running:  # LAS and fair-share read attained service
            self._progress(i, t)
        if self.refresh_estimates:
            self._refresh_estimates()
        t0 = clock() if clock else 0.0
        result, new_state = self.scheduler.cycle(self.state, list(self.queue.values()), t, explain=False)
        if clock:
            self.metrics.decision_times.append(clock() - t0)
        for p in result.preempted:
            i = int(p.allocation_id)
            self._stop(i, t, preempted=True)
        for r in result.resized:
            i = int(r.allocation_id)
            self._progress(i, t)
            del self.running[i]
            redo = min(self.config.resize_penalty_s, self.jobs[i].duration_s)
            self.remaining[i] += redo
            self.metrics.redone(self.requests[i], redo, "resize")
            self._start(i, np.asarray(r.gpus, dtype=np.int64), t)
            self.records[i].resizes += 1
        for p in result.placed:
            i = int(p.request_id)
            del self.queue[i]
            if self.requests[i].queued_since is not None:
                self.metrics.requeued_now -= self.requests[i].gpus * self.requests[i].milli / FULL
            self._start(i, np.asarray(p.gpus, dtype=np.int64), t)
        self.state = new_state
        self.metrics.after_cycle(self.state, self.queue)
        return bool(result.preempted or result.resized)


def simulate(
    jobs: Sequence[TraceJob],
    cluster: Cluster,
    config: SimConfig | None = None,
    clock: Callable[[], float] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    return Simulation(jobs, cluster, config).run(clock, progress)
