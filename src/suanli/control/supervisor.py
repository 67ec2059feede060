"""The supervisor's pass: start what the scheduler placed, watch what runs, end what must end.

For every workload that holds an allocation: a `scheduled` one is launched on its executor (the handle the
executor returns is stored, so a restarted server re-attaches to the same processes); a running one is polled,
and stopped when someone asked, when its `max_duration` is up, or when its org's balance is exhausted beyond
the grace period. When it ends, its allocation closes at the moment it ended (billing stops there), and the
retry policy decides whether it queues again.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import and_, bindparam, false, func, insert, or_, select, update
from sqlalchemy.orm import Session

from suanli.control import health, ledger, metering, proxy, workloads
from suanli.control.sandboxes import SandboxPolicy
from suanli.control.scheduling import EPOCH, seconds
from suanli.db.engine import Database
from suanli.db.models import Allocation, Node, Plan, User, Workload, WorkloadEvent
from suanli.executors import Executor, Launch, NodeRank, Status, executor
from suanli.sandbox.bwrap import SandboxError
from suanli.storage import workdirs
from suanli.workloads.spec import WorkloadSpec, format_duration

log = logging.getLogger("suanli.supervisor")
WATCHED = ("scheduled", "starting", "running")
LAUNCH_GRACE_S = 120.0  # a `starting` attempt with no handle is lost only after this (longer than a lease)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class SupervisorReport:
    launched: int = 0
    finished: int = 0
    requeued: int = 0
    stopping: int = 0


@dataclass
class Supervisor:
    home: Path
    grace_s: float = 10.0
    balance_grace_minutes: float = 5.0
    executors: dict[str, Executor] = field(default_factory=dict)
    chunk: int = 200  # virtual workloads per transaction
    sandboxes: SandboxPolicy = field(default_factory=SandboxPolicy)

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
            broke = self._broke_orgs(s)
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
            except Exception:  # left scheduled: the per-workload path below tries again next pass
                log.exception("launching virtual workloads failed")
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
        w.started_at = now  # of `starting`, until it runs: how long a launch has been under way
        workloads.transition(s, w, "starting", f"launching {len(launch.ranks)} node-rank(s) on the {w.executor} "
                             "executor", now)  # fmt: skip
        return launch

    def _start(self, db: Database, wid: str, launch: Launch, now: datetime, report: SupervisorReport) -> None:
        """Launch outside any transaction; the handle goes to a file beside the logs at once (so a server that dies
        before storing it re-attaches from the file), then into the row."""
        with db.read() as s:
            executor_name = s.scalar(select(Workload.executor).where(Workload.id == wid)) or "local"
        try:
            handle = self.executor(executor_name).launch(launch, seconds(now))
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

    def _broke_orgs(self, s: Session) -> dict[str, Decimal]:
        """Orgs whose balance is below zero by more than the grace period of what they run: org -> balance."""
        rates = s.execute(
            select(Allocation.org_id, func.sum(Allocation.rate_per_hour))
            .where(Allocation.stopped_at.is_(None), Allocation.rate_per_hour > 0)
            .group_by(Allocation.org_id)
        ).all()
        out = {}
        for org, rate in rates:
            balance = ledger.org_balance(s, org)
            if _broke(Decimal(rate), balance, self.balance_grace_minutes):
                out[org] = balance
        return out

    # ---- one workload --------------------------------------------------------------------------------------
    def _step(self, s: Session, w: Workload, now: datetime, broke: Decimal | None, report: SupervisorReport) -> None:
        """`broke`: the org's balance when it is out of money beyond the grace period, else None."""
        if w.state == "scheduled":
            self._launch(s, w, now, report)
            return
        if w.handle is None:  # the server stopped between `starting` and storing the handle
            saved = _read_handle(workdirs.log_dir(self.home, w.id, w.attempt))
            if saved is not None:
                self._running(s, w, saved, now, "running (re-attached: the server restarted while launching it)")
                return
            if w.started_at is not None and (now - w.started_at).total_seconds() < LAUNCH_GRACE_S:
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
        if w.stop_requested and "stop_sent" not in w.handle:
            ex.stop(w.handle, seconds(now))
            w.handle = {**w.handle, "stop_sent": seconds(now)}
            report.stopping += 1
        status = ex.poll(w.handle, seconds(now))
        if status.state != "running":
            self._finish(s, w, status, now, report)

    def _launch_virtual(self, s: Session, ids: list[str], now: datetime) -> int:
        """Launch placed workloads on the virtual executor, a chunk at a time: no processes to lose, so one
        transaction may cover many (thousands launch in a few statements when a big queue is placed at once)."""
        w = Workload
        q = (
            select(w.id, w.state, w.stop_requested, w.spec, w.attempt, w.name, w.predicted_s, Allocation.placement)
            .join(Allocation, Allocation.id == w.allocation_id)
            .where(w.id.in_(ids))
        )
        if s.get_bind().dialect.name == "postgresql":
            q = q.with_for_update(of=w.__table__)
        ex = self.executor("virtual")
        updates, events = [], []
        for r in s.execute(q):
            if r.state != "scheduled" or r.stop_requested:
                continue
            spec = WorkloadSpec.model_validate(r.spec)
            log_dir = workdirs.log_dir(self.home, r.id, r.attempt)  # the virtual executor creates it when it writes
            ranks = tuple(NodeRank(n, i, tuple(g)) for i, (n, g) in enumerate(r.placement.items()))
            duration = spec.duration if spec.duration is not None else r.predicted_s
            launch = Launch(workload_id=r.id, attempt=r.attempt, command=spec.command or "", workdir=log_dir,
                            env={}, ranks=ranks, log_dir=log_dir, duration_s=duration)  # fmt: skip
            handle = ex.launch(launch, seconds(now))
            deadline = _deadline(s, spec, now)
            ends = now + timedelta(seconds=duration) if duration is not None else None
            updates.append({"wid": r.id, "h": handle, "t": now, "d": deadline, "e": ends})
            events += [{"workload_id": r.id, "at": now, "state": "starting",
                        "reason": f"launching {len(ranks)} node-rank(s) on the virtual executor"},
                       {"workload_id": r.id, "at": now, "state": "running", "reason": "running"}]  # fmt: skip
        if updates:
            t = w.__table__.c
            s.execute(
                update(w.__table__).where(t.id == bindparam("wid"))
                .values(state="running", reason="running", handle=bindparam("h"), started_at=bindparam("t"),
                        deadline_at=bindparam("d"), ends_at=bindparam("e")),
                updates,
            )  # fmt: skip
            s.execute(insert(WorkloadEvent.__table__), events)
        return len(updates)

    def _launch_of(self, s: Session, w: Workload) -> Launch:
        spec = WorkloadSpec.model_validate(w.spec)
        alloc = s.get(Allocation, w.allocation_id) if w.allocation_id else None
        placement = alloc.placement if alloc is not None else {}
        where: dict[str, dict[str, Any]] = {}
        if w.executor in ("ray", "slurm"):  # the engine's handle of each node, and its address
            where = dict(s.execute(select(Node.name, Node.labels).where(Node.name.in_(list(placement)))).tuples().all())
        ranks = tuple(
            NodeRank(node, i, tuple(int(g) for g in gpus), str((where.get(node) or {}).get("engine_host", "")),
                     str((where.get(node) or {}).get("address", "")))
            for i, (node, gpus) in enumerate(placement.items())
        )  # fmt: skip
        master = ranks[0].address if ranks and ranks[0].address else "127.0.0.1"
        log_dir = workdirs.log_dir(self.home, w.id, w.attempt)
        log_dir.mkdir(parents=True, exist_ok=True)
        if spec.kind == "instance":
            cwd = workdirs.instance_disk(self.home, w.id)
        else:
            upload = workdirs.upload_dir(self.home, w.id)
            cwd = upload / spec.workdir if w.has_workdir else upload
        cwd.mkdir(parents=True, exist_ok=True)
        sandbox = None
        if w.executor != "virtual":
            user = s.get(User, w.user_id)
            sandbox = self.sandboxes.request(spec, w.org_id, bool(user is not None and user.is_admin))
        command = spec.command or "exec sleep infinity"
        extra_env = {"SUANLI_WORKLOAD_NAME": w.name, "SUANLI_KIND": spec.kind}
        if spec.kind == "instance" and w.executor == "local":  # reachable through the server's proxy
            access = proxy.prepare_launch(self.home, w, spec, log_dir, command, sandbox is not None,
                                          sandbox.uid if sandbox is not None else None)  # fmt: skip
            command, extra_env = access.command, {**extra_env, **access.env}
            if sandbox is not None and access.mount is not None:
                sandbox = replace(sandbox, mounts=(*sandbox.mounts, access.mount))
        return Launch(
            workload_id=w.id, attempt=w.attempt, command=command, workdir=cwd,
            env=dict(spec.env), ranks=ranks, log_dir=log_dir, master_addr=master, master_port=free_port(),
            grace_s=self.grace_s,
            duration_s=spec.duration if spec.duration is not None else w.predicted_s,
            extra_env=extra_env, sandbox=sandbox,
        )  # fmt: skip

    def _running(self, s: Session, w: Workload, handle: dict[str, Any], now: datetime, reason: str) -> None:
        spec = WorkloadSpec.model_validate(w.spec)
        w.handle, w.started_at = handle, now
        w.deadline_at = _deadline(s, spec, now)
        duration = spec.duration if spec.duration is not None else w.predicted_s
        if w.executor == "virtual" and duration is not None:
            w.ends_at = now + timedelta(seconds=duration)
        workloads.transition(s, w, "running", reason, now)

    def _launch(self, s: Session, w: Workload, now: datetime, report: SupervisorReport) -> None:
        """In one transaction: for the virtual executor, which starts no process."""
        try:
            launch = self._launch_of(s, w)
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
        if alloc is not None and w.started_at is not None:
            held = max(0.0, ((alloc.stopped_at or end) - alloc.started_at).total_seconds())
            w.attained_gpu_s += held * alloc.gpus * alloc.milli / 1000
        w.exit_code = status.exit_code
        asked = w.stop_requested
        fault = bool(asked and asked.startswith(health.NODE_FAILURE))
        if fault and status.state == "exited" and status.exit_code == 0:
            asked = None  # it ended on its own before the fault was noticed: it succeeded
        if asked and asked.startswith("preempted"):
            state, cause, reason = "preempted", "preemption", asked
        elif asked and fault:
            state, cause, reason = "failed", "node-failure", asked
            if alloc is not None:
                health.credit_fault(s, w, alloc, now)
        elif asked:
            state, cause, reason = "stopped", None, asked
        elif status.state == "lost":
            state, cause, reason = "failed", "node-failure", f"lost: {status.reason}"
        elif status.exit_code == 0:
            state, cause, reason = "succeeded", None, status.reason or "exit code 0"
        else:
            state, cause, reason = "failed", "failure", status.reason or f"exit code {status.exit_code}"
        report.finished += 1
        if cause is not None and cause in spec.retry.on and w.retries < spec.retry.limit:
            w.retries += 1
            workloads.transition(s, w, state, reason, now)
            workloads.requeue(s, w, f"retry {w.retries}/{spec.retry.limit} after {cause}: {reason}", now)
            report.requeued += 1
            return
        workloads.transition(s, w, state, reason, now)


def _plan_end(s: Session, spec: WorkloadSpec) -> datetime | None:
    plan_id = spec.plan_id()
    plan = s.get(Plan, plan_id) if plan_id else None
    return plan.ends_at if plan is not None else None


def _deadline(s: Session, spec: WorkloadSpec, now: datetime) -> datetime | None:
    """When the supervisor must look again without being asked: `max_duration` is up, or the plan ends."""
    times = [now + timedelta(seconds=spec.max_duration)] if spec.max_duration is not None else []
    end = _plan_end(s, spec)
    if end is not None:
        times.append(end)
    return min(times, default=None)


def _over_time(spec: dict, started_at: datetime | None, now: datetime) -> bool:
    limit = spec.get("max_duration")
    return limit is not None and started_at is not None and (now - started_at).total_seconds() >= float(limit)


def _broke(rate: Decimal | None, balance: Decimal, grace_minutes: float) -> bool:
    """Out of money: the balance is below zero by more than `grace_minutes` of the workload's rate."""
    if not rate or rate <= 0:
        return False
    return balance < -(rate * Decimal(str(grace_minutes)) / 60)


HANDLE_FILE = "handle.json"


def _write_handle(log_dir: Path, handle: dict[str, Any]) -> None:
    tmp = log_dir / f".{HANDLE_FILE}.tmp"
    tmp.write_text(json.dumps(handle), encoding="utf-8")
    os.replace(tmp, log_dir / HANDLE_FILE)


def _read_handle(log_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((log_dir / HANDLE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
