"""Persisting what a scheduling pass decided: preemptions, and placements a chunk at a time, each placement's
admission (balance, quota, plan, the member's spend limit, the spec's price ceiling) checked again under its
org's row lock. A refused placement writes nothing and stays pending with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from suanli.billing.money import ZERO
from suanli.control.accounts import memberships, spend_limits
from suanli.control.errors import ServiceError
from suanli.control.money import metering, prices
from suanli.control.workloads import workloads
from suanli.db.models import Allocation, Plan, Workload, WorkloadEvent
from suanli.workloads.host import host_text
from suanli.workloads.runtime import predicted_runtime
from suanli.workloads.spec import WorkloadSpec, format_duration

if TYPE_CHECKING:
    from suanli.control.scheduling.snapshot import ClusterView
    from suanli.topology import Cluster

# (workload id, the cluster it goes to, GPU indices by node name, the scheduler's reason)
Placement = tuple[str, "ClusterView", dict[str, list[int]], str]


def specs_of(s: Session, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Specs of workloads, by id (read 500 at a time)."""
    out: dict[str, dict[str, Any]] = {}
    for i in range(0, len(ids), 500):
        out.update(
            (wid, spec)
            for wid, spec in s.execute(select(Workload.id, Workload.spec).where(Workload.id.in_(ids[i : i + 500])))
        )
    return out


def preempt(s: Session, preempts: list[tuple[str, str, str]], now: datetime) -> int:
    """Take the victims' GPUs back (their allocations close: billing ends) and ask them to stop. The reason names
    the work that took the GPUs only to its own org; another tenant's victim reads "preempted for on-demand work of
    another tenant", never its name, id or org."""
    n = 0
    for wid, reason, by_id in preempts:
        w = s.get(Workload, wid, with_for_update=True, populate_existing=True)
        if w is None or w.state not in ("scheduled", "starting", "running"):
            continue
        by = s.get(Workload, by_id) if by_id else None
        if by is not None and by.org_id == w.org_id:
            reason = reason.replace(by_id, f"{by.name} ({by.id})", 1)
        elif by_id:
            reason = reason.replace(f" {by_id}", " of another tenant", 1).replace(by_id, "another tenant's work")
        if w.allocation_id is not None:  # billing ends when the scheduler takes the GPUs back
            metering.close_allocation(s, w.allocation_id, now)  # (a victim already stopping, too)
        if w.stop_requested:  # already stopping for another reason, which stands
            continue
        w.stop_requested = reason
        workloads.event(s, w, f"preemption: {reason}", now)
        n += 1
    return n


def plan_refusal(s: Session, plan_id: str, gpus: int, now: datetime, use: dict[str, int]) -> str | None:
    """Why a plan's GPUs cannot take this placement now (ended, or all in use), or None. Called under the org's
    row lock, so two placements cannot both take the plan's last GPUs."""
    plan = s.get(Plan, plan_id)
    if plan is None or not plan.starts_at <= now < plan.ends_at:
        return f"cannot start: plan {plan_id} is not active; resubmit with other billing"
    if plan_id not in use:
        use[plan_id] = int(s.scalar(
            select(func.coalesce(func.sum(Allocation.gpus), 0))
            .where(Allocation.billing_mode == f"plan:{plan_id}", Allocation.stopped_at.is_(None))
        ) or 0)  # fmt: skip
    if use[plan_id] + gpus > plan.gpus:
        return f"waits for plan {plan_id}: its {plan.gpus} GPUs, {use[plan_id]} in use by other workloads"
    return None


def place_chunk(
    s: Session, items: list[Placement], now: datetime, *, hold_minutes: int, cache: dict[str, WorkloadSpec],
    lengths: Callable[[WorkloadSpec, Cluster, Sequence[int]], float | None] | None = None,
) -> tuple[int, dict[str, tuple[str, int]]]:  # fmt: skip
    """Open the allocations of a chunk of placements and mark their workloads scheduled: a handful of
    statements for the whole chunk. Admission is checked per placement against each org's load, read once
    under its row lock; a refused placement writes nothing and stays pending with the reason. `lengths` says how
    long a run lasts on its GPUs (`resizing.RunLengths`: the virtual executor's run; default the perf model's)."""
    w = Workload
    q = select(w.id, w.state, w.stop_requested, w.attempt, w.org_id, w.user_id).where(
        w.id.in_([wid for wid, *_ in items])
    )
    if s.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(of=w.__table__)
    rows = {r.id: r for r in s.execute(q)}
    misses = [wid for wid in rows if wid not in cache]  # parsed when queued; read only what is not
    parsed = {wid: WorkloadSpec.model_validate(doc) for wid, doc in specs_of(s, misses).items()}
    _, book = prices.current(s)
    loads: dict[str, metering.OrgLoad] = {}
    allocs: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    refused: dict[str, tuple[str, int]] = {}
    plan_use: dict[str, int] = {}  # GPUs of each plan in use, counting this chunk's placements
    spending: dict[tuple[str, str], spend_limits.Spending | None] = {}  # members' spend limits, counting this chunk's
    spenders: dict[tuple[str, str], bool] = {}  # whether each submitter may still spend its org's money
    lost: list[str] = []  # work whose submitter may not: stopped, never placed
    for wid, view, placement, reason in items:
        r = rows.get(wid)
        if r is None or r.state != "pending" or r.stop_requested:
            continue
        spec = cache.get(wid) or parsed[wid]
        first = view.index[next(iter(placement))]
        gpus = sum(len(v) for v in placement.values())
        gpu_model = view.topology.group_of(first).gpu.name if gpus and view.topology is not None else None
        plan = spec.plan_id()
        if r.org_id not in loads:
            loads[r.org_id] = metering.org_load(s, r.org_id)
        if plan is not None:
            why = plan_refusal(s, plan, gpus, now, plan_use)
            if why is not None:
                refused[wid] = (why, 0)
                continue
        if (r.org_id, r.user_id) not in spenders:
            spenders[r.org_id, r.user_id] = memberships.may_spend(s, r.org_id, r.user_id)
        if not spenders[r.org_id, r.user_id]:
            lost.append(wid)
            continue
        member = member_spending(s, spending, loads[r.org_id], r.user_id, now)
        elastic = spec.gpu_range()
        alloc, refusal = None, ""
        # Elastic work grown into idle GPUs at placement (the `elastic` plugin) but over what the org may hold
        # or afford starts smaller, down to its minimum: the first GPUs of the placement keep its shape.
        shrinks = elastic and not plan and spec.resources.nodes is None  # a fixed node count keeps its shape
        for size in range(gpus, (min(elastic[0], gpus) if shrinks else gpus) - 1, -1):
            part = _first_gpus(placement, size) if size < gpus else placement
            cpu, mem = spec.host_held(len(g) for g in part.values())  # per node-rank, as the scheduler counts it
            try:
                alloc = metering.admitted_row(
                    s, org_id=r.org_id, user_id=r.user_id, workload=wid, gpu_model=gpu_model, gpus=size,
                    placement=part, now=now, hold_minutes=hold_minutes, milli=spec.milli(),
                    mode=f"plan:{plan}" if plan else spec.billing_mode(), allocation_id=f"{wid}.{r.attempt + 1}",
                    rate=ZERO if plan else None, load=loads[r.org_id], book=book, cpu_milli=cpu, memory_mib=mem,
                )  # fmt: skip
            except ServiceError as e:
                refusal = refusal or e.message
                continue
            # The spec's price ceiling, checked at submission at its minimum and the prices then: here at the size
            # it is placed at (elastic work grown into idle GPUs) and the prices in force (raised while it waited).
            over = price_refusal(spec, alloc)
            if over is None and member and alloc["rate_per_hour"]:
                over = member.admit(alloc["rate_per_hour"], hold_minutes)
            if over is not None:  # (a submission saw none of the member's queued work: its limit holds here)
                unadmit(loads[r.org_id], alloc)
                alloc, refusal = None, refusal or over
                continue
            if size < gpus:
                reason = f"{reason + '; ' if reason else ''}{size} of {gpus} GPUs admitted: {refusal}"
            placement, gpus = part, size
            break
        if alloc is None:
            refused[wid] = (f"cannot start yet: {refusal}", 0)
            continue
        where = ", ".join(f"{n}[{','.join(map(str, g))}]" if g else n for n, g in list(placement.items())[:8])
        more = f" and {len(placement) - 8} more nodes" if len(placement) > 8 else ""
        what = f"{gpus} x {gpu_model}" if gpu_model else "no GPUs"
        if alloc["cpu_milli"] or alloc["memory_mib"]:
            what += f" with {host_text(alloc['cpu_milli'], alloc['memory_mib'])}"
        predicted = None
        if view.topology is not None and gpus and (spec.duration is None or lengths is not None):
            on = _global_gpus(view, placement)
            predicted = lengths(spec, view.topology, on) if lengths else predicted_runtime(spec, view.topology, on)
        told = ""
        if predicted and spec.duration is None:
            told = f"; the performance model predicts {format_duration(predicted)} here"
        text = (f"placed: {what} on {where}{more}" + (f" ({reason})" if reason else "") + told)[:2000]
        if plan is not None:
            plan_use[plan] += gpus
        allocs.append(alloc)
        updates.append({"wid": wid, "why": text, "n": r.attempt + 1, "aid": alloc["id"],
                        "ex": view.nodes[first][1], "p": predicted})  # fmt: skip
        events.append({"workload_id": wid, "at": now, "state": "scheduled", "reason": text})
    for gone in s.scalars(select(Workload).where(Workload.id.in_(lost))) if lost else ():
        workloads.transition(s, gone, "stopped", f"not started: {memberships.LOST_SPEND}", now)
    if allocs:
        t = w.__table__.c
        s.execute(insert(Allocation.__table__), allocs)
        s.execute(
            update(w.__table__).where(t.id == bindparam("wid"))
            .values(state="scheduled", reason=bindparam("why"), pending_reason="", queue_position=None,
                    attempt=bindparam("n"), allocation_id=bindparam("aid"), executor=bindparam("ex"),
                    predicted_s=bindparam("p")),
            updates,
        )  # fmt: skip
        s.execute(insert(WorkloadEvent.__table__), events)
    return len(allocs), refused


def member_spending(
    s: Session, cache: dict[tuple[str, str], spend_limits.Spending | None], load: metering.OrgLoad, user_id: str,
    now: datetime,
) -> spend_limits.Spending | None:  # fmt: skip
    """The member's spend limit and what counts against it, read once per pass under the org's row lock (held by
    `load`); None without a limit, and in a personal org (as at submission)."""
    key = (load.org.id, user_id)
    if key not in cache:
        cache[key] = None if load.org.personal else spend_limits.spending(s, load.org.id, user_id, now)
    return cache[key]


def price_refusal(spec: WorkloadSpec, row: dict[str, Any]) -> str | None:
    """Why an allocation row (`metering.admitted_row`) costs more an hour than the spec's `max_price_per_hour`, or
    None. Held at every placement and every grow, as at submission (`admission.candidates`): a plan's prepaid GPUs
    cost nothing, its host CPU and memory what the book says."""
    ceiling, rate = spec.max_price_per_hour, row["rate_per_hour"]
    if ceiling is None or rate <= ceiling:
        return None
    host = host_text(row["cpu_milli"], row["memory_mib"]) if row["cpu_milli"] or row["memory_mib"] else ""
    if row["gpus"] and row["gpu_model"]:
        what = f"{row['gpus']} x {row['gpu_model']}" + (f" with {host}" if host else "")
    else:
        what = host or "it"
    return f"max_price_per_hour: {what} cost {rate:.2f}/h, above the ceiling {ceiling}"


def unadmit(load: metering.OrgLoad, row: dict[str, Any]) -> None:
    """Take back from `load` an allocation row `metering.admitted_row` counted in it, but that is not opened."""
    load.rate, load.gpus = load.rate - row["rate_per_hour"], load.gpus - row["gpus"]
    load.cpu_milli, load.memory_mib = load.cpu_milli - row["cpu_milli"], load.memory_mib - row["memory_mib"]


def _first_gpus(placement: dict[str, list[int]], n: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for node, gpus in placement.items():
        if n <= 0:
            break
        out[node], n = gpus[:n], n - len(gpus[:n])
    return out


def _global_gpus(view: ClusterView, placement: dict[str, list[int]]) -> list[int]:
    assert view.topology is not None
    return [view.topology.gpus_of_node(view.index[n]).start + g for n, gs in placement.items() for g in gs]
