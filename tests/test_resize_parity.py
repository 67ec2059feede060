"""The same decisions in `suanli sim` and on the server: a small trace of elastic and rigid jobs on 2 x 8 H20,
replayed through the simulator's engine and through the server's `SchedulingPass` + `Supervisor` on a database with
the virtual executor, driven by the same clock (passes at the trace's event times, no sleeping). Every placement
and every resize — which job, from what size to what size, when — must match.

What is inherently different, and how the test pins it down rather than loosening the comparison:
- Time: the simulator runs cycles only at events (an arrival, an end), and at one instant again only while work
  still waits after a cycle that resized or preempted (`Simulation._schedule`). The server's loop runs a pass every
  `schedule_interval_s` whenever something changed, its own resizes included: after shrinking `e0` for `r1` at
  t=40 it would grow `e0` back into the 6 GPUs left idle half a second later, where the simulator leaves them idle
  until the next event (t=70). The test therefore calls the server's passes at the event instants only: first the
  supervisor (runs that ended), then the pass, then the supervisor (launches and restarts), as the simulator
  processes an instant's events before its cycle; and, like `_schedule`, up to 4 passes at one instant while a pass
  resized or preempted and work still waits. Times are compared to 1 ms (the server keeps microseconds). A resize is
  compared at the instant it was decided (its event); its allocations switch at the last whole second of the old
  one at or before that instant, so that every second is billed once (`resizing.carry_out`).
- Run lengths: on virtual nodes a rigid job lasts its declared `duration` wherever it lands, while the simulator
  slows a gang spread over nodes (`sim.runtime`). Elastic runs use the simulator's model on both sides (speed from
  `sched.scaling`, placement slowdown from `sim.runtime`, 30 s of work redone per resize). The trace's rigid jobs fit
  one node, and the test asserts the simulator never slowed one (slowdown 1.0), so this difference never applies.
"""

from __future__ import annotations

import itertools
import re
from datetime import datetime
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.control.ids import utcnow
from suanli.db.models import Allocation, Workload, WorkloadEvent
from suanli.sched import ClusterState
from suanli.sim import SimConfig, Simulation, TraceJob
from suanli.topology import presets
from tests.test_resize_virtual import Cluster, elastic, make_cluster, rigid

PRESET = "2x8:H20"
# (name, submit s, GPUs, elastic max or None, duration s at its own (minimum) size)
TRACE = [
    ("e0", 0, 2, 16, 900),
    ("r1", 40, 8, None, 200),
    ("e2", 70, 4, 8, 600),
    ("r3", 130, 4, None, 150),
    ("r4", 150, 8, None, 100),
    ("e5", 320, 2, 6, 400),
    ("r6", 700, 2, None, 60),
]

Decision = tuple[float, str, int, int]  # (time, job, from GPUs (0: placed), to GPUs)


def simulate() -> tuple[list[Decision], Simulation]:
    jobs = [TraceJob(name, float(t), n, float(d), gpu_type="H20", min_gpus=n if hi else None, max_gpus=hi)
            for name, t, n, hi, d in TRACE]  # fmt: skip
    sim = Simulation(jobs, presets.load_preset(PRESET), SimConfig())
    names = [j.job_id for j in jobs]
    out: list[Decision] = []
    cycle = sim.scheduler.cycle

    def recorded(state: ClusterState, queue: Any, now: float, explain: bool = True) -> Any:
        result, after = cycle(state, queue, now, explain)
        for p in result.placed:
            out.append((now, names[int(p.request_id)], 0, len(p.gpus)))
        for r in result.resized:
            out.append((now, names[int(r.allocation_id)], state.allocations[r.allocation_id].gpu_count, len(r.gpus)))
        return result, after

    sim.scheduler.cycle = recorded  # type: ignore[method-assign]
    sim.run()
    return out, sim


def serve(c: Cluster) -> tuple[list[Decision], dict[str, float]]:
    """The trace through the server; returns its decisions (from the allocations it opened) and each job's end."""
    arrivals = sorted((t, name) for name, t, *_ in TRACE)
    ids: dict[str, str] = {}

    def ends() -> list[float]:
        with c.db.read() as s:
            rows = s.scalars(select(Workload.ends_at).where(Workload.state == "running", Workload.ends_at.is_not(None)))
            return [(t - c.t0).total_seconds() for t in rows]

    t = 0.0
    for _ in range(200):
        due = [a for a in arrivals if a[0] <= t + 1e-9]
        for at, name in due:
            _, _, n, hi, d = next(x for x in TRACE if x[0] == name)
            ids[name] = c.submit(elastic(name, n, hi, d) if hi else rigid(name, n, d), t=at)
            arrivals.remove((at, name))
        now = c.at(t)
        c.sup.run(c.db, now)
        for _ in range(4):  # as `Simulation._schedule`: again at once while a pass freed GPUs and work waits
            report = c.sched.run(c.db, now)
            c.sup.run(c.db, now)
            if not (report.resized or report.preempted) or report.queued <= report.placed:
                break
        nxt = [x for x in ends() if x > t + 1e-9] + [a[0] for a in arrivals]
        if not nxt:
            break
        t = min(nxt)
    decisions: list[Decision] = []
    finished: dict[str, float] = {}
    with c.db.read() as s:
        for name, wid in ids.items():
            allocs = list(
                s.scalars(select(Allocation).where(Allocation.workload == wid).order_by(Allocation.started_at))
            )
            decisions.append((_s(c, allocs[0].started_at), name, 0, allocs[0].gpus))
            events = s.scalars(select(WorkloadEvent).where(WorkloadEvent.workload_id == wid).order_by(WorkloadEvent.id))
            for e in events:
                m = re.match(r"resized from (\d+) to (\d+) GPUs", e.reason)
                if m:
                    decisions.append((_s(c, e.at), name, int(m[1]), int(m[2])))
            sizes = [d[3] for d in decisions if d[1] == name]
            assert [a.gpus for a in allocs] == sizes  # one allocation per size, in order
            for a, b in itertools.pairwise(allocs):
                assert a.stopped_at == b.started_at  # billing switches at one instant
            w = s.get(Workload, wid)
            assert w is not None and w.state == "succeeded", (name, w.state if w else None, w.reason if w else None)
            assert w.finished_at is not None and w.retries == 0
            finished[name] = _s(c, allocs[-1].stopped_at or w.finished_at)
    return decisions, finished


def _s(c: Cluster, t: datetime) -> float:
    return (t - c.t0).total_seconds()


def by_job(ds: list[Decision]) -> dict[str, list[tuple[float, int, int]]]:
    """Each job's placement and resizes in the order they happened (times to 1 ms)."""
    out: dict[str, list[tuple[float, int, int]]] = {}
    for t, job, a, b in ds:
        out.setdefault(job, []).append((round(t, 3), a, b))
    return out


def test_the_server_resizes_as_the_simulator_does(api: TestClient) -> None:
    expected, sim = simulate()
    assert not sim.running and not sim.queue
    resizes = [d for d in expected if d[2] > 0]
    assert {(a < b) for _, _, a, b in resizes} == {True, False}, "the trace must exercise both grows and shrinks"
    rigid_jobs = {name for name, _, _, hi, _ in TRACE if hi is None}
    for i, rec in enumerate(sim.records):  # the one difference in run lengths never applies to this trace
        if sim.jobs[i].job_id in rigid_jobs:
            assert rec.slowdowns and set(rec.slowdowns) == {1.0}, (sim.jobs[i].job_id, rec.slowdowns)
    c = make_cluster(api, PRESET, top_up="100000")
    assert c.t0 > utcnow()
    got, finished = serve(c)
    assert by_job(got) == by_job(expected)
    assert sorted((round(t, 3), j) for t, j, *_ in got) == sorted((round(t, 3), j) for t, j, *_ in expected)
    for i, rec in enumerate(sim.records):  # and so every job ends when the simulator says
        assert rec.finish is not None
        assert abs(finished[sim.jobs[i].job_id] - rec.finish) < 1e-3, sim.jobs[i].job_id
