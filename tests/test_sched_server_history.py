"""The server's runtime estimates come from the org's own finished jobs, through the same core code the simulator
feeds from its trace (`sched.estimates`); the reads stay bounded however long an org's history. Attacks first: one
tenant's flood of tiny jobs neither reaches another tenant's estimates nor moves its own big job ahead of earlier
work under the default policy. In-process on both databases."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event, insert, select, update

from suanli.control.ids import utcnow
from suanli.control.scheduling.history import LAG_S, LONGEST_RUN_S, ServerHistory
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.db.models import Allocation, Workload
from suanli.sched import Request, SchedulerConfig
from suanli.sched.estimates import RuntimeHistory, for_request, run_seconds
from suanli.workloads.spec import parse_spec
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"


def _spec(name: str, gpus: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": "x", "resources": {"gpu": "H20", "gpus": gpus}, **extra}


def _setup(api: TestClient, *emails: str) -> list[Tenant]:
    adm = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "h20-roce800-128"}, headers=adm)
    assert r.status_code == 201, r.text
    out = []
    for e in emails:
        t = signup(api, e)
        r = api.post(f"{API}/admin/orgs/{t.org_id}/transactions", json={"kind": "topup", "amount": "50000"},
                     headers=adm)  # fmt: skip
        assert r.status_code == 201, r.text
        out.append(t)
    return out


def _finished(api: TestClient, who: Tenant, seconds: list[float], gpus: int = 8, ended: datetime | None = None,
              state: str = "succeeded", kind: str = "job", **extra: Any) -> None:  # fmt: skip
    """Rows of jobs that ran `seconds` each on `gpus` GPUs and ended at `ended` (default: an hour ago), in order."""
    db = api.app.state.server.db  # type: ignore[attr-defined]
    end = ended or utcnow() - timedelta(hours=1)
    spec = parse_spec(_spec("done", gpus, **extra)).model_dump(mode="json")
    rows = []
    for i, d in enumerate(seconds):
        t = end - timedelta(seconds=len(seconds) - i)
        rows.append(dict(id=f"w{who.org_id[-6:]}{kind[0]}{state[0]}{i:07d}{int(end.timestamp()) % 100000}",
                         org_id=who.org_id, user_id=who.user_id, name=f"done-{i}", kind=kind, spec=spec, state=state,
                         reason="", pending_reason="", attempt=1, retries=0, attained_gpu_s=d * gpus,
                         has_workdir=False, created_at=t, submitted_at=t, queued_at=t, started_at=t, finished_at=t))  # fmt: skip
    with db.write() as s, s.begin():
        for i in range(0, len(rows), 500):
            s.execute(insert(Workload), rows[i : i + 500])


def _submit(api: TestClient, who: Tenant, spec: dict[str, Any]) -> str:
    r = api.post(f"{API}/workloads", json={"spec": spec}, headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _request(sched: SchedulingPass, wid: str) -> Request:
    return next(r for k, r in sched.requests.items() if k[0] == wid)


def _expected(tenant: str, seconds: list[float], gpus: int = 8, **kw: Any) -> tuple[float | None, tuple[float, ...]]:
    """What the core computes from these run times alone (a fresh history, as the simulator keeps one)."""
    h = RuntimeHistory()
    for d in seconds:
        took = run_seconds(d, LONGEST_RUN_S)
        if took is not None:
            h.record(tenant, None, gpus, took)
    return for_request(h, tenant, None, gpus, **kw)


def test_the_servers_estimate_is_the_cores_from_the_orgs_own_finished_jobs(api: TestClient) -> None:
    a, b, c = _setup(api, "a@example.com", "b@example.com", "c@example.com")
    mine = [600.0 + 37 * i for i in range(9)]
    _finished(api, a, mine)
    _finished(api, a, [5.0] * 4, state="failed")  # did not run to its end: not a run time
    _finished(api, a, [5.0] * 4, kind="instance")  # interactive: runs until someone stops it
    _finished(api, b, [1.0] * 200)  # another tenant's flood of tiny jobs, the same shape
    _finished(api, a, [2.0] * 5, ended=utcnow() - timedelta(seconds=LAG_S / 2))  # too recent to be settled
    ja, jb, jc = (_submit(api, t, _spec(f"next-{t.email[0]}", 8)) for t in (a, b, c))
    sched = SchedulingPass()
    sched.run(api.app.state.server.db, utcnow())  # type: ignore[attr-defined]
    ra, rb, rc = (_request(sched, j) for j in (ja, jb, jc))
    est, samples = _expected(a.org_id, mine)
    assert est is not None and samples  # 9 run times: the org's (model, GPUs) group
    assert (ra.est_runtime, ra.est_samples) == (est, samples)
    assert (rb.est_runtime, rb.est_samples) == _expected(b.org_id, [1.0] * 200) == (1.0, (1.0,) * 64)
    # c has no history: b's flood is not "everyone's" to c, nor a's (the core's coarsest group is per org here)
    assert (rc.est_runtime, rc.est_samples) == (None, ())


def test_run_times_are_what_the_jobs_ran_through_the_supervisor(api: TestClient) -> None:
    """Not rows written by hand: jobs run on virtual nodes and ended by the supervisor (at the pass that saw them end,
    t=301); the next job of that shape, which declares nothing, is estimated from what they ran once they ended
    `LAG_S` before the pass."""
    from tests.test_resize_virtual import make_cluster, rigid

    c = make_cluster(api)
    ran = [_submit(api, c.tenant, rigid(f"ran-{d}", 2, d)) for d in (100, 300, 200)]
    c.tick(0)
    assert all(c.get(w)["state"] in ("starting", "running") for w in ran)
    c.tick(301)
    assert all(c.get(w)["state"] == "succeeded" for w in ran)
    early = _submit(api, c.tenant, _spec("early", 2))
    c.tick(301 + LAG_S - 1)  # they ended less than LAG_S ago: not yet
    assert (_request(c.sched, early).est_runtime, _request(c.sched, early).est_samples) == (None, ())
    late = _submit(api, c.tenant, _spec("late", 2))
    c.tick(301 + LAG_S + 1)
    r = _request(c.sched, late)
    assert r.est_runtime == 200.0 and r.est_samples == (100.0, 200.0, 300.0)


def test_a_declared_duration_wins_and_max_duration_caps(api: TestClient) -> None:
    (a,) = _setup(api, "a@example.com")
    mine = [900.0, 1000.0, 1100.0, 5000.0]
    _finished(api, a, mine)
    d = _submit(api, a, _spec("declared", 8, duration=60))
    m = _submit(api, a, _spec("capped", 8, max_duration=1050))
    sched = SchedulingPass()
    sched.run(api.app.state.server.db, utcnow())  # type: ignore[attr-defined]
    assert (_request(sched, d).est_runtime, _request(sched, d).est_samples) == (60.0, ())
    rm = _request(sched, m)
    assert (rm.est_runtime, rm.est_samples) == _expected(a.org_id, mine, limit=1050.0)
    assert rm.est_runtime == 1050.0 and rm.est_samples == (900.0, 1000.0, 1050.0, 1050.0)


def test_absurd_run_times_are_ignored_or_capped(api: TestClient) -> None:
    (a,) = _setup(api, "a@example.com")
    _finished(api, a, [0.0, -3600.0, 1e12, 1e12, 1e12])  # a clock that went back; a row nobody ran; 31,000 years
    j = _submit(api, a, _spec("next", 8))
    sched = SchedulingPass()
    sched.run(api.app.state.server.db, utcnow())  # type: ignore[attr-defined]
    r = _request(sched, j)
    assert r.est_runtime == LONGEST_RUN_S and r.est_samples == (LONGEST_RUN_S,) * 3
    assert all(math.isfinite(x) and x > 0 for x in r.est_samples)


def test_the_cycle_runs_with_no_history(api: TestClient) -> None:
    (a,) = _setup(api, "a@example.com")
    j = _submit(api, a, _spec("first", 8))
    m = _submit(api, a, _spec("limited", 8, max_duration=500))
    sched = SchedulingPass()
    report = sched.run(api.app.state.server.db, utcnow())  # type: ignore[attr-defined]
    assert report.placed == 2 and sched.history.rows_read == 0
    assert (_request(sched, j).est_runtime, _request(sched, j).est_samples) == (None, ())
    assert (_request(sched, m).est_runtime, _request(sched, m).est_samples) == (500.0, ())  # enforced: an estimate


def _race(api: TestClient, sched: SchedulingPass) -> tuple[str, str]:
    """b fills 120 of 128 GPUs, then b and, after it, a each queue an 8-GPU job for the 8 left; a's 500 one-second
    jobs of that shape make a's look 1 s long, b's declares an hour. Returns (the job placed, the one waiting)."""
    a, b = _setup(api, "a@example.com", "b@example.com")
    _finished(api, a, [1.0] * 500)
    db = api.app.state.server.db  # type: ignore[attr-defined]
    _submit(api, b, _spec("wall", 120, duration=3600))
    sched.run(db, utcnow())
    jb = _submit(api, b, _spec("earlier", 8, duration=3600))
    ja = _submit(api, a, _spec("short-looking", 8))
    sched.run(db, utcnow())
    assert _request(sched, ja).est_runtime == 1.0 and _request(sched, ja).est_samples == (1.0,) * 64
    states = {j: api.get(f"{API}/workloads/{j}", headers=t.headers).json()["state"] for j, t in ((jb, b), (ja, a))}
    assert sorted(states.values()) == ["pending", "scheduled"], states
    return ("b", "a") if states[jb] == "scheduled" else ("a", "b")


def test_a_flood_of_tiny_jobs_does_not_move_a_big_job_ahead_under_the_default_policy(api: TestClient) -> None:
    """The default policy orders by class, LAS level and submit time: an estimate never moves work ahead of earlier
    work of its class and level (it only decides what may start on GPUs held for work starving past
    `starvation_s`, and when those free up)."""
    assert _race(api, SchedulingPass()) == ("b", "a")


def test_under_srsf_the_servers_estimates_order_the_queue_as_the_cores_do(api: TestClient) -> None:
    """The contrast: a policy that orders by estimated service left (srsf) puts a's short-looking job first, as it
    would with a declared `duration: 1s`: history gives a tenant no more than declaring does (its own work only)."""
    assert _race(api, SchedulingPass(SchedulerConfig(policy="srsf"))) == ("a", "b")


def test_a_lying_estimate_delays_starving_work_at_most_until_the_liar_may_be_preempted(api: TestClient) -> None:
    """Where the default policy does read estimates: GPUs held for work waiting past `starvation_s` (EASY). a's 500
    one-second jobs make its hour-long 8-GPU job look 1 s long, so it may start on the 8 GPUs a starving 128-GPU head
    waits for (it "ends" before the wall frees the rest), as a declared `duration: 1s` would let it. The policy's
    bound: once the liar has run `min_runtime_s` (600 s) and had more GPU-time than the head (a higher LAS level),
    the head preempts it; until then the head waits, no longer."""
    a, b, c = _setup(api, "a@example.com", "b@example.com", "c@example.com")
    _finished(api, a, [1.0] * 500)
    db = api.app.state.server.db  # type: ignore[attr-defined]
    sched, t0 = SchedulingPass(), utcnow()
    wall = _submit(api, b, _spec("wall", 120, duration=100))
    sched.run(db, t0)
    head = _submit(api, c, _spec("head", 128, duration=3600))
    with db.write() as s, s.begin():  # it has waited 49 hours: past `starvation_s`, it holds what frees up
        s.execute(update(Workload).where(Workload.id == head)
                  .values(submitted_at=t0 - timedelta(hours=49), queued_at=t0 - timedelta(hours=49)))  # fmt: skip
    liar = _submit(api, a, _spec("liar", 8))

    def state(who: Tenant, wid: str) -> dict[str, Any]:
        return dict(api.get(f"{API}/workloads/{wid}", headers=who.headers).json())

    def stop_asked(wid: str) -> str | None:
        with db.read() as s:
            return s.scalar(select(Workload.stop_requested).where(Workload.id == wid))

    sched.run(db, t0 + timedelta(seconds=1))
    assert _request(sched, liar).est_runtime == 1.0
    assert state(a, liar)["state"] == "scheduled" and state(c, head)["state"] == "pending"
    with db.write() as s, s.begin():  # the wall ends on time (at t0 + 100 s)
        s.execute(update(Allocation).where(Allocation.workload == wall).values(stopped_at=t0 + timedelta(seconds=100)))
    sched.run(db, t0 + timedelta(seconds=300))
    assert state(c, head)["state"] == "pending" and stop_asked(liar) is None  # ran < 600 s
    sched.run(db, t0 + timedelta(seconds=602))
    assert str(stop_asked(liar)).startswith("preempted"), stop_asked(liar)
    sched.run(db, t0 + timedelta(seconds=603))
    assert state(c, head)["state"] == "scheduled", state(c, head)


def test_reads_are_bounded_and_incremental(api: TestClient) -> None:
    """The first pass reads at most `startup_rows` (the newest), each later pass only what ended since, at most
    `batch_rows`; the statements a pass runs do not grow with the history."""
    a, b = _setup(api, "a@example.com", "b@example.com")
    db = api.app.state.server.db  # type: ignore[attr-defined]
    _finished(api, a, [float(i + 1) for i in range(300)], ended=utcnow() - timedelta(hours=2))
    sched = SchedulingPass(history=ServerHistory(startup_rows=100, batch_rows=40))
    statements: list[str] = []

    def record(c: Any, cur: Any, sql: str, *rest: Any) -> None:
        statements.append(sql)

    def a_pass() -> int:
        _submit(api, b, _spec(f"tick-{len(statements)}", 1))  # something changed: the pass runs
        statements.clear()
        for e in {db.engine, db.read_engine}:
            event.listen(e, "before_cursor_execute", record)
        try:
            sched.run(db, utcnow())
        finally:
            for e in {db.engine, db.read_engine}:
                event.remove(e, "before_cursor_execute", record)
        return len(statements)

    a_pass()
    assert sched.history.rows_read == 100
    assert sched.history.of(a.org_id).samples(a.org_id, None, 8) == tuple(float(x) for x in range(237, 301))
    quiet = a_pass()
    assert sched.history.rows_read == 0
    _finished(api, a, [1.0] * 90, ended=utcnow() - timedelta(hours=1))
    for n in (40, 40, 10):  # a burst is read over several passes; one more statement: the specs not held
        assert a_pass() == quiet + 1 and sched.history.rows_read == n
    assert a_pass() == quiet and sched.history.rows_read == 0
    if db.engine.dialect.name == "sqlite":  # the read is a range of the finished_at index, never a scan or a sort
        reads = [q for q in statements if "workloads.finished_at" in q and "ORDER BY" in q]
        assert reads, statements
        with db.engine.connect() as c:
            t = utcnow()
            plan = c.exec_driver_sql("EXPLAIN QUERY PLAN " + reads[0], (t, t, "", t, 40, 0)).all()
        text = " ".join(str(row[-1]) for row in plan)
        # (ids are sorted only within one instant's endings: "RIGHT PART OF ORDER BY")
        assert "ix_workloads_finished_at" in text and "TEMP B-TREE FOR ORDER BY" not in text, text


def test_for_request_asks_the_core_what_the_simulator_asks_at_an_arrival() -> None:
    """Nothing declared, nothing limiting: the two values the simulator takes (`estimate`, `samples`)."""
    h = RuntimeHistory()
    for i, d in enumerate((30.0, 10.0, 20.0, 400.0, 50.0)):
        h.record("t", "m" if i % 2 else None, 4, d)
    for model, gpus in (("m", 4), (None, 4), (None, 8), ("x", 1)):
        assert for_request(h, "t", model, gpus) == (h.estimate("t", model, gpus), h.samples("t", model, gpus))
    assert for_request(h, "nobody", None, 1) == (30.0, (10.0, 20.0, 30.0, 50.0, 400.0))  # "everyone's": shared
    # history lends a tenant others' run times, which is why the server keeps a history per org
    assert run_seconds(float("nan"), 10.0) is None and run_seconds(0.0, 10.0) is None
    assert run_seconds(-1.0, 10.0) is None and run_seconds(11.0, 10.0) == 10.0 and run_seconds(3.0, 10.0) == 3.0


def test_cpu_only_jobs_specs_are_never_read_and_specs_come_a_batch_at_a_time(api: TestClient, monkeypatch: Any) -> None:
    """Review: after a restart the first pass fetched the spec of every succeeded job before it dropped the ones that
    held no GPU, so a flood of CPU-only jobs with specs near the 1 MiB body limit could make one pass hold gigabytes.
    Jobs that held no GPU-second are skipped before their spec is read, and specs are read `SPEC_BATCH` at a time."""
    from suanli.control.scheduling import history, placing

    (a,) = _setup(api, "a@example.com")
    _finished(api, a, [0.0] * 30, ended=utcnow() - timedelta(hours=3))  # CPU-only: no GPU-second held
    _finished(api, a, [float(i + 1) for i in range(7)], ended=utcnow() - timedelta(hours=2))
    asked: list[list[str]] = []
    real = placing.specs_of

    def spy(s: Any, ids: list[str]) -> Any:
        asked.append(list(ids))
        return real(s, ids)

    monkeypatch.setattr(placing, "specs_of", spy)
    monkeypatch.setattr(history, "SPEC_BATCH", 3)
    sched = SchedulingPass(history=ServerHistory())
    _submit(api, a, _spec("tick", 1))
    sched.run(api.app.state.server.db, utcnow())  # type: ignore[attr-defined]
    ended = [[i for i in batch if not i.startswith("wl_")] for batch in asked]  # (not the queued job's own spec)
    assert sum(map(len, ended)) == 7 and max(map(len, ended)) <= 3, asked
    assert sched.history.of(a.org_id).samples(a.org_id, None, 8) == tuple(float(x) for x in range(1, 8))


def _waits_while_history_grows(api: TestClient, sched: SchedulingPass) -> tuple[Request, list[float], str]:
    """a's job queues behind a's 128-GPU wall, then three of a's jobs of its shape end: the next pass reads them."""
    (a,) = _setup(api, "a@example.com")
    db = api.app.state.server.db  # type: ignore[attr-defined]
    _submit(api, a, _spec("wall", 128))
    sched.run(db, utcnow())
    j = _submit(api, a, _spec("next", 8))
    sched.run(db, utcnow() + timedelta(seconds=1))
    assert _request(sched, j).est_samples == ()  # nothing had ended
    ran = [300.0, 400.0, 500.0]
    _finished(api, a, ran, ended=utcnow())
    sched.run(db, utcnow() + timedelta(seconds=2 * LAG_S))
    return _request(sched, j), ran, a.org_id


def test_with_gittins_a_queued_jobs_samples_follow_its_orgs_history(api: TestClient) -> None:
    """The Gittins order reads each queued job's samples; the server retakes them as the org's history grows, as
    `suanli sim` does (tests/test_sched_gittins.py), so work that waited is ordered by what ended meanwhile."""
    req, ran, org = _waits_while_history_grows(api, SchedulingPass(SchedulerConfig(gittins=True)))
    assert (req.est_runtime, req.est_samples) == _expected(org, ran) == (400.0, tuple(ran))


def test_without_gittins_an_estimate_is_taken_once_when_work_is_first_queued(api: TestClient) -> None:
    req, _, _ = _waits_while_history_grows(api, SchedulingPass())
    assert (req.est_runtime, req.est_samples) == (None, ())


def test_with_gittins_a_flood_of_tiny_jobs_buys_a_big_job_at_most_min_runtime_ahead(api: TestClient) -> None:
    """The attack on the Gittins order: a's 500 one-second jobs make its 8-GPU job look a second long, so it is
    ordered before b's earlier job of the same class (as under `srsf`, or with a declared `duration: 1s`). The
    bound is LAS preemption, unchanged: once the liar has run `min_runtime_s` (600 s) it has had 4,800 GPU-seconds,
    a LAS level above b's waiting job, and b's job takes its GPUs; back in the queue, past every one of its samples,
    it ranks by 1 / what it has had, below b's."""
    a, b = _setup(api, "a@example.com", "b@example.com")
    _finished(api, a, [1.0] * 500)
    db = api.app.state.server.db  # type: ignore[attr-defined]
    sched, t0 = SchedulingPass(SchedulerConfig(gittins=True)), utcnow()
    _submit(api, b, _spec("wall", 120))
    sched.run(db, t0)
    earlier = _submit(api, b, _spec("earlier", 8))
    liar = _submit(api, a, _spec("short-looking", 8))

    def state(who: Tenant, wid: str) -> str:
        return str(api.get(f"{API}/workloads/{wid}", headers=who.headers).json()["state"])

    sched.run(db, t0 + timedelta(seconds=1))
    assert _request(sched, liar).est_samples == (1.0,) * 64
    assert (state(a, liar), state(b, earlier)) == ("scheduled", "pending")
    sched.run(db, t0 + timedelta(seconds=300))
    assert state(b, earlier) == "pending"  # the liar has run < 600 s
    sched.run(db, t0 + timedelta(seconds=602))
    with db.read() as s:
        assert str(s.scalar(select(Workload.stop_requested).where(Workload.id == liar))).startswith("preempted")
    sched.run(db, t0 + timedelta(seconds=603))
    assert state(b, earlier) == "scheduled"
