"""Workloads as tenants see them: list, describe, stop, start (a submission's checks and insert: `admission`).

A workload row is a state machine (`pending → scheduled → starting → running → succeeded | failed | stopped |
preempted`, and `running ⇄ stopped` for instances). Every transition goes through `transition`, which records
an event with its reason. The scheduling loop (`control.scheduling.scheduling`) and the supervisor
(`control.workloads.supervisor`) move workloads forward; this module holds what requests do to a workload and what
every caller reads.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.billing.metering import billable_seconds, cost_of
from suanli.billing.money import ZERO, exact
from suanli.control.accounts import accounts, memberships, spend_limits
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Conflict, NotFound
from suanli.control.money import metering, usage
from suanli.control.workloads.admission import parse
from suanli.db.models import Allocation, Workload, WorkloadEvent
from suanli.workloads.spec import WorkloadSpec

ACTIVE = ("pending", "scheduled", "starting", "running")
MAX_QUEUED = 1000  # pending workloads an org may have at once (settings `max_queued_per_org`)
TERMINAL = ("succeeded", "failed", "stopped", "preempted")
LIST_LIMIT = 1000


def spec_of(w: Workload) -> WorkloadSpec:
    return WorkloadSpec.model_validate(w.spec)


def transition(s: Session, w: Workload, state: str, reason: str, now: datetime) -> None:
    """Move the workload to `state` and record why."""
    w.state, w.reason = state, reason[:2000]
    if state != "pending":
        w.pending_reason, w.queue_position = "", None
    if state in TERMINAL:
        w.finished_at, w.scale_to = now, None
    s.add(WorkloadEvent(workload_id=w.id, at=now, state=state, reason=w.reason))


# ---- reads ------------------------------------------------------------------------------------------------------
def _visible_orgs(s: Session, who: Principal) -> list[str]:
    return [o.id for o, _ in accounts.orgs_of(s, who)]


def get(s: Session, who: Principal, ref: str, *, lock: bool = False) -> Workload:
    """By id, or by name: the newest of that name in the caller's orgs. Another org's workload does not exist."""
    w = s.get(Workload, ref, with_for_update=lock, populate_existing=lock)
    if w is None:
        q = select(Workload).where(Workload.name == ref, Workload.org_id.in_(_visible_orgs(s, who)))
        q = q.order_by(Workload.created_at.desc()).limit(1)
        w = s.scalar(q.with_for_update() if lock else q)
    if w is None or (w.org_id not in _visible_orgs(s, who) and not who.is_admin):
        raise NotFound(f"workload {ref} not found")
    return w


def listing(s: Session, who: Principal, *, all: bool = False, org_id: str | None = None) -> list[Workload]:
    orgs = [accounts.org_for(s, who, org_id).id] if org_id else _visible_orgs(s, who)
    q = select(Workload).where(Workload.org_id.in_(orgs))
    if not all:
        # what is still going on: active work, and instances that can start again (their disk is kept)
        q = q.where((Workload.state.in_(ACTIVE)) | ((Workload.kind == "instance") & Workload.state.in_(TERMINAL)))
    return list(s.scalars(q.order_by(Workload.created_at.desc()).limit(LIST_LIMIT)))


def events(s: Session, workload_id: str) -> list[WorkloadEvent]:
    return list(s.scalars(select(WorkloadEvent).where(WorkloadEvent.workload_id == workload_id)
                          .order_by(WorkloadEvent.id)))  # fmt: skip


def allocations_of(s: Session, workload_ids: list[str]) -> dict[str, list[Allocation]]:
    out: dict[str, list[Allocation]] = {}
    for i in range(0, len(workload_ids), 500):
        for a in s.scalars(select(Allocation).where(Allocation.workload.in_(workload_ids[i : i + 500]))):
            out.setdefault(a.workload, []).append(a)
    return out


def cost(allocs: list[Allocation], now: datetime) -> Decimal:
    """What the workload has cost so far: every second of every attempt, by the metering rule (the open
    attempt's completed seconds), whether or not the metering loop has posted it yet; work billed by usage: what
    is charged, and the seconds not charged yet at the full rate (`usage.cost_so_far`)."""
    total = ZERO
    for a in allocs:
        if a.billing_mode == usage.USAGE:
            total += usage.cost_so_far(a, now)
            continue
        end = a.stopped_at or now
        seconds = billable_seconds(max(0.0, (end - a.started_at).total_seconds()), a.stopped_at is not None)
        total += cost_of(a.rate_per_hour, seconds)
    return exact(total)


# ---- stop and start ---------------------------------------------------------------------------------------------
def stop(s: Session, who: Principal, ref: str, now: datetime, reason: str = "") -> Workload:
    """Pending or placed work stops at once; running work is asked to stop (the supervisor signals it, waits
    its grace period and records the end). Another member's work: owners and admins only."""
    w = get(s, who, ref, lock=True)
    memberships.check_work(s, who, w, "stop")
    why = reason or f"stopped by {who.email}"
    if w.state in ("pending", "scheduled"):
        if w.allocation_id is not None and w.state == "scheduled":
            metering.close_allocation(s, w.allocation_id, now)
        transition(s, w, "stopped", why, now)
    elif w.state in ("starting", "running"):
        if w.stop_requested is None:
            w.stop_requested = why
            event(s, w, f"stop requested: {why}", now)
    elif w.state == "stopped":
        pass
    else:
        raise Conflict(f"workload {w.id} already {w.state}")
    return w


def stop_queued(s: Session, org_id: str, user_id: str, why: str, now: datetime) -> int:
    """Stop the user's work still waiting in the org's queue (they may no longer spend its money: removed, or made
    a viewer); what runs goes on, as with a spend limit. Returns how many stopped."""
    rows = s.scalars(select(Workload).where(Workload.org_id == org_id, Workload.state == "pending",
                                            Workload.user_id == user_id).with_for_update())  # fmt: skip
    n = 0
    for w in rows:
        transition(s, w, "stopped", why, now)
        n += 1
    return n


def start(
    s: Session, who: Principal, ref: str, now: datetime, no_gpu: bool = False, max_queued: int = MAX_QUEUED
) -> Workload:
    """An instance that was stopped (or preempted, or failed) queues again, with its disk as it left it.

    `no_gpu`: it runs as CPU-only work (1 core and 2 GiB, on demand at the CPU price) to reach its disk, as on
    AutoDL; its own spec, GPUs and billing (a plan's GPUs too) come back on its next ordinary start. Starting needs
    a role that submits (another member's instance: owners and admins), and charges this month within the
    caller's spend limit."""
    w = get(s, who, ref, lock=True)
    memberships.check_work(s, who, w, "start")
    if w.org_id != who.personal_org_id:
        spend_limits.check_spend(s, who, memberships.access(s, who, w.org_id), now)
    if w.kind != "instance":
        raise Conflict(f"workload {w.id} is a job; only instances start again (submit the job anew)")
    if w.state in ACTIVE:
        return w
    waiting = select(Workload.id).where(Workload.org_id == w.org_id, Workload.state == "pending").limit(max_queued)
    queued = s.scalar(select(func.count()).select_from(waiting.subquery())) or 0
    if queued >= max_queued:  # as at submission: stopping and starting again is no way past the queue's bound
        raise Conflict(f"queue: organisation {w.org_id} has {queued} workloads waiting, the most an organisation "
                       "may (max_queued_per_org); wait for some to start, or stop some")  # fmt: skip
    own = w.gpu_spec or w.spec
    if no_gpu:
        cpu_only = {k: v for k, v in own.items() if k not in ("resources", "billing", "max_price_per_hour")}
        w.gpu_spec, w.spec = own, parse({**cpu_only, "resources": {"gpus": 0}}).model_dump(mode="json")
    elif w.gpu_spec is not None:
        w.spec, w.gpu_spec = w.gpu_spec, None
    w.submitted_at = now  # its owner starts it again: a new place at the back of the queue
    if w.user_id != who.user_id and not memberships.may_spend(s, w.org_id, w.user_id):
        w.user_id = who.user_id  # its maker left the team (or may no longer spend): whoever starts it spends
    how = " without GPUs (CPU only)" if no_gpu else ""
    requeue(s, w, f"started by {who.email}{how}", now)
    return w


def requeue(s: Session, w: Workload, reason: str, now: datetime) -> None:
    """Back into the queue. It keeps its place (`submitted_at`); its wait counts from now. A size its owner asked
    for ends with the run: placed again, it is elastic as its spec says."""
    w.queued_at, w.finished_at, w.stop_requested, w.exit_code = now, None, None, None
    w.allocation_id, w.handle, w.executor, w.started_at = None, None, "", None
    w.deadline_at = w.ends_at = w.predicted_s = w.scale_to = w.restart_reason = w.restarted_at = None
    w.pending_reason = "waiting for the next scheduling cycle"
    transition(s, w, "pending", reason, now)


def event(s: Session, w: Workload, reason: str, now: datetime) -> None:
    """Something happened to the workload that does not change its state (a stop request, a preemption)."""
    s.add(WorkloadEvent(workload_id=w.id, at=now, state=w.state, reason=reason[:2000]))


def state_counts(s: Session) -> dict[str, int]:
    """Workloads of every org by state: what the operator's summary shows."""
    rows = s.execute(select(Workload.state, func.count()).group_by(Workload.state))
    return {state: int(n) for state, n in rows}
