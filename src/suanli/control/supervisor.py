"""The supervisor's pass: start what the scheduler placed, watch what runs, end what must end.

For every workload that holds an allocation: a `scheduled` one is launched on its executor (the handle the
executor returns is stored, so a restarted server re-attaches to the same processes); a running one is polled,
and stopped when someone asked, when its `max_duration` is up, or when its org's balance is exhausted beyond
the grace period. When it ends, its allocation closes at the moment it ended (billing stops there), and the
retry policy decides whether it queues again.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.billing.money import ZERO
from suanli.control import ledger, metering, workloads
from suanli.control.scheduling import EPOCH, seconds
from suanli.db.engine import Database
from suanli.db.models import Allocation, Workload
from suanli.executors import Executor, Launch, NodeRank, Status, executor
from suanli.storage import workdirs
from suanli.workloads.spec import WorkloadSpec, format_duration

log = logging.getLogger("suanli.supervisor")
WATCHED = ("scheduled", "starting", "running")


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

    def executor(self, name: str) -> Executor:
        if name not in self.executors:
            self.executors[name] = executor(name)
        return self.executors[name]

    def run(self, db: Database, now: datetime) -> SupervisorReport:
        report = SupervisorReport()
        with db.read() as s:
            rows = list(s.execute(
                select(Workload.id, Workload.state, Workload.executor, Workload.handle, Workload.stop_requested,
                       Workload.started_at, Workload.spec, Workload.org_id, Allocation.rate_per_hour)
                .outerjoin(Allocation, Allocation.id == Workload.allocation_id)
                .where(Workload.state.in_(WATCHED))
            ))  # fmt: skip
            balances = {org: ledger.org_balance(s, org) for org in {r.org_id for r in rows}}
        for r in rows:
            if not self._needs_attention(r, now, balances):
                continue
            try:
                with db.write() as s, s.begin():
                    w = s.get(Workload, r.id, with_for_update=True, populate_existing=True)
                    if w is not None and w.state in WATCHED:
                        self._step(s, w, now, balances.get(w.org_id, ZERO), report)
            except Exception:  # one workload's trouble (a full disk, a database hiccup) must not stop the others
                log.exception("supervising %s failed", r.id)
        return report

    def _needs_attention(self, r: Any, now: datetime, balances: dict[str, Decimal]) -> bool:
        """Cheap in-memory check, so thousands of running virtual workloads cost no write transaction a tick."""
        if r.state != "running" or r.handle is None:
            return True
        if r.stop_requested and "stop_sent" not in r.handle:
            return True
        broke = _broke(r.rate_per_hour, balances.get(r.org_id, ZERO), self.balance_grace_minutes)
        if not r.stop_requested and (broke or _over_time(r.spec, r.started_at, now)):
            return True
        if r.executor == "virtual" and not r.stop_requested:
            d = r.handle.get("duration_s")
            return d is not None and seconds(now) >= r.handle["start"] + d
        return True

    # ---- one workload --------------------------------------------------------------------------------------
    def _step(self, s: Session, w: Workload, now: datetime, balance: Decimal, report: SupervisorReport) -> None:
        if w.state == "scheduled":
            self._launch(s, w, now, report)
            return
        if w.handle is None:  # the server stopped between `starting` and storing the handle
            self._finish(s, w, Status("lost", None, "the server stopped while launching it"), now, report)
            return
        ex = self.executor(w.executor)
        spec = WorkloadSpec.model_validate(w.spec)
        alloc = s.get(Allocation, w.allocation_id) if w.allocation_id else None
        if w.stop_requested is None:
            if _over_time(w.spec, w.started_at, now):
                w.stop_requested = f"max_duration {format_duration(spec.max_duration or 0)} reached"
            elif alloc is not None and _broke(alloc.rate_per_hour, balance, self.balance_grace_minutes):
                w.stop_requested = f"balance exhausted ({balance:.2f}); top up and submit again"
            if w.stop_requested:
                workloads.event(s, w, f"stopping: {w.stop_requested}", now)
        if w.stop_requested and "stop_sent" not in w.handle:
            ex.stop(w.handle, seconds(now))
            w.handle = {**w.handle, "stop_sent": seconds(now)}
            report.stopping += 1
        status = ex.poll(w.handle, seconds(now))
        if status.state != "running":
            self._finish(s, w, status, now, report)

    def _launch(self, s: Session, w: Workload, now: datetime, report: SupervisorReport) -> None:
        spec = WorkloadSpec.model_validate(w.spec)
        alloc = s.get(Allocation, w.allocation_id) if w.allocation_id else None
        placement = alloc.placement if alloc is not None else {}
        ranks = tuple(
            NodeRank(node, i, tuple(int(g) for g in gpus)) for i, (node, gpus) in enumerate(placement.items())
        )
        log_dir = workdirs.log_dir(self.home, w.id, w.attempt)
        log_dir.mkdir(parents=True, exist_ok=True)
        if spec.kind == "instance":
            cwd = workdirs.instance_disk(self.home, w.id)
        else:
            cwd = (
                workdirs.upload_dir(self.home, w.id) / spec.workdir
                if w.has_workdir
                else workdirs.upload_dir(self.home, w.id)
            )
        cwd.mkdir(parents=True, exist_ok=True)
        launch = Launch(
            workload_id=w.id, attempt=w.attempt, command=spec.command or "exec sleep infinity", workdir=cwd,
            env=dict(spec.env), ranks=ranks, log_dir=log_dir, master_port=free_port(), grace_s=self.grace_s,
            duration_s=spec.duration, extra_env={"SUANLI_WORKLOAD_NAME": w.name, "SUANLI_KIND": spec.kind},
        )  # fmt: skip
        workloads.transition(s, w, "starting", f"launching {len(ranks)} node-rank(s) on the {w.executor} executor",
                             now)  # fmt: skip
        try:
            w.handle = self.executor(w.executor).launch(launch, seconds(now))
        except Exception as e:
            log.exception("launch of %s failed", w.id)
            self._finish(s, w, Status("lost", None, f"could not start: {e}"), now, report)
            return
        w.started_at = now
        workloads.transition(s, w, "running", "running", now)
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
        if asked and asked.startswith("preempted"):
            state, cause, reason = "preempted", "preemption", asked
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


def _over_time(spec: dict, started_at: datetime | None, now: datetime) -> bool:
    limit = spec.get("max_duration")
    return limit is not None and started_at is not None and (now - started_at).total_seconds() >= float(limit)


def _broke(rate: Decimal | None, balance: Decimal, grace_minutes: float) -> bool:
    """Out of money: the balance is below zero by more than `grace_minutes` of the workload's rate."""
    if not rate or rate <= 0:
        return False
    return balance < -(rate * Decimal(str(grace_minutes)) / 60)
