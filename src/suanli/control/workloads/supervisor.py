"""The supervisor's pass: start what the scheduler placed, watch what runs, end what must end.

For every workload that holds an allocation: a `scheduled` one is launched on its executor (the handle the
executor returns is stored, so a restarted server re-attaches to the same processes); a running one is polled,
and stopped when someone asked, when its `max_duration` is up, or when its org's balance is exhausted beyond
the grace period. When it ends, its allocation closes at the moment it ended (billing stops there), and the
retry policy decides whether it queues again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import and_, false, or_, select
from sqlalchemy.orm import Session

from suanli.control.money import metering, overdraft
from suanli.control.scheduling.clock import EPOCH, seconds
from suanli.control.telemetry import health
from suanli.control.workloads import resizing, workloads
from suanli.control.workloads.launches import Launches, _deadline, _length, _plan_end, _read_handle, _write_handle
from suanli.control.workloads.sandboxes import SandboxPolicy
from suanli.db.engine import Database
from suanli.db.models import Allocation, Workload
from suanli.executors import Executor, Launch, Status, executor
from suanli.sandbox.bwrap import SandboxError
from suanli.storage import workdirs
from suanli.storage.s3 import S3Config
from suanli.workloads.spec import WorkloadSpec, format_duration

log = logging.getLogger("suanli.supervisor")
WATCHED = ("scheduled", "starting", "running")
LAUNCH_GRACE_S = 120.0  # a `starting` attempt with no handle is lost only after this (longer than a lease)


@dataclass
class SupervisorReport:
    launched: int = 0
    finished: int = 0
    requeued: int = 0
    stopping: int = 0
    restarted: int = 0  # resized work whose ranks restarted on its new allocation


@dataclass
class Supervisor(Launches):
    home: Path
    grace_s: float = 10.0
    volumes_root: Path | None = None  # `volumes_dir` (None: volumes/ in `home`)
    volumes_s3: S3Config | None = None  # the S3 volume backend, where the operator set one up
    pulls: dict[str, list[tuple[str, str, int | None]]] = field(
        default_factory=dict
    )  # workload -> s3 volumes to pull first
    balance_grace_minutes: float = 5.0
    interval_s: float = 0.5  # how often the loop runs a pass (`schedule_interval_s`): a stop for money is asked early
    executors: dict[str, Executor] = field(default_factory=dict)
    chunk: int = 200  # virtual workloads per transaction
    sandboxes: SandboxPolicy = field(default_factory=SandboxPolicy)
    resize_penalty_s: float = 30.0  # work a virtual run redoes when a resize restarts it (`suanli sim`'s, too)

    def executor(self, name: str) -> Executor:
        if name not in self.executors:
            self.executors[name] = executor(name)
        return self.executors[name]

    def run(self, db: Database, now: datetime) -> SupervisorReport:
        """One pass. Only workloads that need attention are read (to launch; running on a process executor; asked
        to stop; past their deadline or their virtual end; of an org out of money), so thousands of running
        virtual workloads cost one query. Local work is handled one workload per transaction (a launched
        process must never lose its handle to a rolled-back batch); virtual work in chunks."""
        report = SupervisorReport()
        with db.read() as s:
            broke = self._broke_orgs(s, now)
            w = Workload
            due = or_(w.executor != "virtual", w.stop_requested.is_not(None), w.deadline_at <= now, w.ends_at <= now,
                      w.handle.is_(None), w.org_id.in_(broke) if broke else false())  # fmt: skip
            rows = list(s.execute(
                select(w.id, w.executor, w.state, w.stop_requested)
                .where(or_(w.state.in_(("scheduled", "starting")), and_(w.state == "running", due)))
                .order_by(w.queued_at)
            ))  # fmt: skip
        launch = [r.id for r in rows if r.executor == "virtual" and r.state == "scheduled" and not r.stop_requested]
        launching = set(launch)
        for i in range(0, len(launch), self.chunk):
            try:
                with db.write() as s, s.begin():
                    report.launched += self._launch_virtual(s, launch[i : i + self.chunk], now)
            except Exception:  # a bad chunk: each of its workloads alone, so one's trouble cannot stop the others
                log.exception("launching virtual workloads failed")
                for one in launch[i : i + self.chunk]:
                    self._launch_virtual_alone(db, one, now, report)
        batch = [r.id for r in rows if r.executor == "virtual" and r.id not in launching]
        single = [[r.id] for r in rows if r.executor != "virtual"]
        for ids in [*single, *(batch[i : i + self.chunk] for i in range(0, len(batch), self.chunk))]:
            try:
                self._steps(db, ids, now, broke, report)
            except Exception:  # a bad chunk: each of its workloads alone, so one's trouble cannot stop the others
                log.exception("supervising %s failed", ids[:3])
                if len(ids) > 1:
                    for one in ids:
                        try:
                            self._steps(db, [one], now, broke, report)
                        except Exception:
                            log.exception("supervising %s failed", one)
        return report

    def _launch_virtual_alone(self, db: Database, wid: str, now: datetime, report: SupervisorReport) -> None:
        """One virtual workload in its own transaction; one that cannot launch (a run length no date holds) ends as
        unable to start, its allocation closed at once, instead of failing every pass."""
        try:
            with db.write() as s, s.begin():
                report.launched += self._launch_virtual(s, [wid], now)
            return
        except Exception as e:
            log.exception("launching %s failed", wid)
            why = f"could not start: {type(e).__name__}: {e}"
        try:
            with db.write() as s, s.begin():
                w = s.get(Workload, wid, with_for_update=True, populate_existing=True)
                if w is not None and w.state == "scheduled":
                    self._finish(s, w, Status("exited", None, why[:500]), now, report)
        except Exception:
            log.exception("ending %s failed", wid)

    def _steps(
        self, db: Database, ids: list[str], now: datetime, broke: dict[str, Decimal], report: SupervisorReport
    ) -> None:
        prepared: list[tuple[str, Launch]] = []
        with db.write() as s, s.begin():
            for wid in ids:
                w = s.get(Workload, wid, with_for_update=True, populate_existing=True)
                if w is None or w.state not in WATCHED:
                    continue
                if w.state == "scheduled" and w.stop_requested:  # preempted (or stopped) before it started
                    self._finish(s, w, Status("exited", None, "stopped before it started"), now, report)
                elif w.state == "scheduled" and w.executor != "virtual":
                    try:
                        prepared.append((w.id, self._prepare(s, w, now)))
                    except Exception as e:  # its workdir cannot be made (a file in the way): it never can
                        log.exception("preparing %s failed", w.id)
                        self._finish(s, w, Status("exited", None, f"could not start: {e}"), now, report)
                else:
                    self._step(s, w, now, broke.get(w.org_id), report)
        for wid, launch in prepared:
            self._start(db, wid, launch, now, report)

    def _prepare(self, s: Session, w: Workload, now: datetime) -> Launch:
        """Record `starting` (committed before any process exists: a crash from here on can never launch the same
        attempt twice) and say what to launch."""
        launch = self._launch_of(s, w)
        if w.restarted_at is not None:  # a resize's restart: the run keeps its start
            w.restarted_at = now
        else:
            w.started_at = now  # of `starting`, until it runs: how long a launch has been under way
        workloads.transition(s, w, "starting", f"launching {len(launch.ranks)} node-rank(s) on the {w.executor} "
                             "executor", now)  # fmt: skip
        return launch

    def _start(self, db: Database, wid: str, launch: Launch, now: datetime, report: SupervisorReport) -> None:
        """Launch outside any transaction; the handle goes to a file beside the logs at once (so a server that dies
        before storing it re-attaches from the file), then into the row. The handle names its attempt: a resize
        decided meanwhile (a new attempt on a new allocation) restarts it."""
        with db.read() as s:
            executor_name = s.scalar(select(Workload.executor).where(Workload.id == wid)) or "local"
        try:
            self._pull_volumes(wid)
            handle = {**self.executor(executor_name).launch(launch, seconds(now)), "attempt": launch.attempt}
            _write_handle(launch.log_dir, handle)
        except Exception as e:
            log.exception("launch of %s failed", wid)
            with db.write() as s, s.begin():
                w = s.get(Workload, wid, with_for_update=True, populate_existing=True)
                if w is not None and w.state == "starting":
                    # A sandbox this node cannot build (an image not loaded here) is no node failure to retry.
                    state = "exited" if isinstance(e, SandboxError) else "lost"
                    self._finish(s, w, Status(state, None, f"could not start: {e}"), now, report)
            return
        with db.write() as s, s.begin():
            w = s.get(Workload, wid, with_for_update=True, populate_existing=True)
            if w is not None and w.state == "starting" and w.handle is None:
                self._running(s, w, handle, now, "running")
                report.launched += 1
                return
        # Another leader decided about this attempt meanwhile (it took the lease over during a long pass): the
        # processes just started must not run on GPUs nobody pays for.
        log.warning("attempt of %s was decided elsewhere while launching; stopping what was launched", wid)
        self.executor(executor_name).stop(handle, seconds(now))

    def _broke_orgs(self, s: Session, now: datetime) -> dict[str, Decimal]:
        """Orgs whose charged work must stop now, before their balance passes the grace: org -> balance."""
        lead = overdraft.stop_lead_s(self.grace_s, self.interval_s)
        return overdraft.broke_orgs(s, now, self.balance_grace_minutes, lead)

    # ---- one workload --------------------------------------------------------------------------------------
    def _step(self, s: Session, w: Workload, now: datetime, broke: Decimal | None, report: SupervisorReport) -> None:
        """`broke`: the org's balance when it is out of money beyond the grace period, else None."""
        if w.state == "scheduled":
            self._launch(s, w, now, report)
            return
        if w.handle is None:  # the server stopped between `starting` and storing the handle
            saved = _read_handle(workdirs.log_dir(self.home, w.id, w.attempt))
            if saved is not None:  # it ran from its launch, not from now: an end learned later is measured from there
                launched = saved.get("launched_at")
                began = EPOCH + timedelta(seconds=launched) if isinstance(launched, int | float) else now
                self._running(s, w, saved, now, "running (re-attached: the server restarted while launching it)",
                              started=min(now, max(began, w.queued_at)))  # fmt: skip
                return
            since = w.restarted_at or w.started_at
            if since is not None and (now - since).total_seconds() < LAUNCH_GRACE_S:
                return  # a launch may still be under way in another process: give it time to write its handle
            self._finish(s, w, Status("lost", None, "the server stopped while launching it"), now, report)
            return
        ex = self.executor(w.executor)
        spec = WorkloadSpec.model_validate(w.spec)
        alloc = s.get(Allocation, w.allocation_id) if w.allocation_id else None
        if w.stop_requested is None:
            plan_end = _plan_end(s, spec)
            if _over_time(w.spec, w.started_at, now):
                w.stop_requested = f"max_duration {format_duration(spec.max_duration or 0)} reached"
            elif plan_end is not None and now >= plan_end:
                w.stop_requested = f"plan {spec.plan_id()} ended at {plan_end:%Y-%m-%d %H:%M} UTC"
            elif broke is not None and alloc is not None and alloc.rate_per_hour > 0:
                w.stop_requested = f"balance exhausted ({broke:.2f}); top up and submit again"
            if w.stop_requested:
                workloads.event(s, w, f"stopping: {w.stop_requested}", now)
        restart = _restarting(w) and alloc is not None and not w.stop_requested
        if (w.stop_requested or restart) and "stop_sent" not in w.handle:
            ex.stop(w.handle, seconds(now))  # SIGTERM, then SIGKILL after the grace period
            w.handle = {**w.handle, "stop_sent": seconds(now)}
            if restart and alloc is not None:
                workloads.event(s, w, f"stopping its ranks to restart them on {alloc.gpus} GPUs", now)
            report.stopping += 1
        status = ex.poll(w.handle, seconds(now))
        if status.state == "running":
            return
        resized = w.handle.get("resized_at", seconds(alloc.started_at) if alloc is not None else None)
        early = resized is not None and status.ended_at is not None and status.ended_at < resized
        if restart and alloc is not None and not early:
            self._restart(s, w, alloc, status, now, report)
            return
        if early and _restarting(w) and status.ended_at is not None:  # it ended on its own before the resize
            resizing.end_early(s, f"{w.id}.{w.handle['attempt']}", EPOCH + timedelta(seconds=status.ended_at), now)
        self._finish(s, w, status, now, report)

    def _restart(
        self, s: Session, w: Workload, alloc: Allocation, status: Status, now: datetime, report: SupervisorReport
    ) -> None:
        """The attempt stopped for a resize has exited: launch the next one on the new allocation, with
        SUANLI_RESTART_REASON=resize. Not a failure, no retry spent, its place kept; a virtual run goes on with the
        work it had left (`resizing.rest_of_run`)."""
        spec = WorkloadSpec.model_validate(w.spec)
        duration = None
        if w.executor == "virtual":
            stopped = status.ended_at if status.ended_at is not None else seconds(now)
            duration = resizing.rest_of_run(w.handle or {}, stopped, spec, self.resize_penalty_s, _length(w, spec))
        w.handle, w.exit_code, w.restart_reason, w.restarted_at = None, None, "resize", now
        workloads.transition(s, w, "scheduled", f"restarting on {alloc.gpus} GPUs (attempt {w.attempt}) after the "
                             "resize", now)  # fmt: skip
        report.restarted += 1
        if w.executor == "virtual":  # no process to start: at once, in this transaction
            self._launch(s, w, now, report, duration)

    def _running(self, s: Session, w: Workload, handle: dict[str, Any], now: datetime, reason: str,
                 started: datetime | None = None) -> None:  # fmt: skip
        """Store the handle (naming its attempt, and how long a whole run lasts on its GPUs); a resize's restart keeps
        the run's start, so `max_duration` counts from it. `started`: when it really started (a re-attached launch)."""
        spec = WorkloadSpec.model_validate(w.spec)
        w.handle = {"attempt": w.attempt, "length_s": _length(w, spec), **handle}
        if w.restarted_at is None or w.started_at is None:
            w.started_at = started or now
        w.deadline_at = _deadline(s, spec, w.started_at)
        if w.executor == "virtual":
            duration = handle.get("duration_s")
            w.ends_at = now + timedelta(seconds=duration) if duration is not None else None
        workloads.transition(s, w, "running", reason, now)

    def _launch(
        self, s: Session, w: Workload, now: datetime, report: SupervisorReport, duration_s: float | None = None
    ) -> None:
        """In one transaction: for the virtual executor, which starts no process."""
        try:
            launch = self._launch_of(s, w, duration_s)
        except Exception as e:
            self._finish(s, w, Status("exited", None, f"could not start: {e}"), now, report)
            return
        workloads.transition(s, w, "starting", f"launching {len(launch.ranks)} node-rank(s) on the {w.executor} "
                             "executor", now)  # fmt: skip
        try:
            handle = self.executor(w.executor).launch(launch, seconds(now))
        except Exception as e:
            log.exception("launch of %s failed", w.id)
            self._finish(s, w, Status("lost", None, f"could not start: {e}"), now, report)
            return
        self._running(s, w, handle, now, "running")
        report.launched += 1

    def _finish(self, s: Session, w: Workload, status: Status, now: datetime, report: SupervisorReport) -> None:
        spec = WorkloadSpec.model_validate(w.spec)
        end = now
        ended = status.ended_at
        if ended is not None and w.started_at is not None:  # it ended while nobody watched (server down)
            end = min(now, max(w.started_at, EPOCH + timedelta(seconds=ended)))
        alloc = metering.close_allocation(s, w.allocation_id, end) if w.allocation_id else None
        # Closed earlier by a preemption that came after the run had ended unseen (a restarted server's first pass):
        # the stop moves back to the executor's record of the end, and a settled bill gives the seconds back.
        ended_first = (
            ended is not None and alloc is not None and alloc.stopped_at is not None and end < alloc.stopped_at
        )
        if ended_first and alloc is not None:
            metering.stop_earlier(s, alloc.id, end, now)
        if alloc is not None and w.started_at is not None:
            held = max(0.0, ((alloc.stopped_at or end) - alloc.started_at).total_seconds())
            w.attained_gpu_s += held * alloc.gpus * alloc.milli / 1000
        w.exit_code = status.exit_code
        asked = w.stop_requested
        fault = bool(asked and asked.startswith(health.NODE_FAILURE))
        if fault and status.state == "exited" and status.exit_code == 0:
            asked = None  # it ended on its own before the fault was noticed: it succeeded
        if ended_first and status.state == "exited":
            asked = None  # it ended on its own before the preemption came: its exit code says how
        if asked and asked.startswith("preempted"):
            state, cause, reason = "preempted", "preemption", asked
        elif asked and fault:
            state, cause, reason = "failed", "node-failure", asked
            if alloc is not None:
                health.credit_fault(s, w, alloc, now)
        elif asked:
            state, cause, reason = "stopped", None, asked
        elif status.state == "lost":  # its node or its supervisor vanished: the platform's fault, not the tenant's
            state, cause, reason = "failed", "node-failure", f"lost: {status.reason}"
            if alloc is not None:
                health.credit_fault(s, w, alloc, now, why=reason)
        elif status.exit_code == 0:
            state, cause, reason = "succeeded", None, status.reason or "exit code 0"
        else:
            state, cause, reason = "failed", "failure", status.reason or f"exit code {status.exit_code}"
        report.finished += 1
        if cause is not None and cause in spec.retry.on and w.retries < spec.retry.limit:
            w.retries += 1
            workloads.transition(s, w, state, reason, now)
            workloads.requeue(s, w, f"retry {w.retries}/{spec.retry.limit} after {cause}: {reason}", now)
            w.restart_reason = cause
            report.requeued += 1
            return
        workloads.transition(s, w, state, reason, now)


def _restarting(w: Workload) -> bool:
    """A resize gave it a new attempt on a new allocation since the running one was launched: its ranks must restart
    there. (The allocation of attempt N is `<workload>.<N>`.)"""
    return w.handle is not None and w.handle.get("attempt", w.attempt) != w.attempt


def _over_time(spec: dict, started_at: datetime | None, now: datetime) -> bool:
    limit = spec.get("max_duration")
    return limit is not None and started_at is not None and (now - started_at).total_seconds() >= float(limit)
