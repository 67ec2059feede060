"""What a fatal health finding does: the GPU (or node) is marked unhealthy, the node is drained so nothing new
lands on it, and every workload on the failed hardware is asked to stop as a node failure. The supervisor then
requeues or fails it by its retry policy and credits the tenant for the GPU time the fault cost
(`credit_fault`). Every action is a node event or a workload event that names its cause.

Faults can be injected into virtual nodes, whose simulated GPUs then report them, so the whole chain can be
exercised without hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from suanli.billing.metering import DEFAULT_WINDOW_S, billable_seconds, cost_of
from suanli.control.errors import Invalid
from suanli.control.money import ledger, usage
from suanli.control.scheduling import inventory
from suanli.control.settings import Settings
from suanli.control.telemetry.telemetry import FleetIndex
from suanli.control.workloads import workloads
from suanli.db.models import Allocation, Gpu, Node, Workload
from suanli.db.telemetry import InjectedFault, NodeEvent
from suanli.telemetry.health import Finding, HealthJudge, HealthRules
from suanli.telemetry.samples import GpuSample

NODE_FAILURE = "node-failure: "  # the prefix of a stop request the supervisor treats as a node failure
FAULT_KINDS = ("overtemp", "xid", "ecc_dbe", "off_bus", "silent")
ONE_SHOT = ("xid", "ecc_dbe")  # reported once; the others last until the node is repaired (set ready)


def rules_of(settings: Settings) -> HealthRules:
    extra: dict[str, Any] = {}
    if settings.health_fatal_xids is not None:
        extra["fatal_xids"] = tuple(settings.health_fatal_xids)
    return HealthRules(overtemp_margin_c=settings.health_overtemp_margin_c,
                       overtemp_samples=settings.health_overtemp_samples,
                       heartbeat_timeout_s=settings.health_heartbeat_s, **extra)  # fmt: skip


@dataclass
class HealthReport:
    gpus_marked: int = 0
    nodes_drained: int = 0
    workloads_stopped: list[str] = field(default_factory=list)


def note(s: Session, node_id: str, gpu: int | None, kind: str, reason: str, now: datetime) -> None:
    s.add(NodeEvent(node_id=node_id, gpu=gpu, at=now, kind=kind, reason=reason[:2000]))


def apply(s: Session, findings: Sequence[Finding], now: datetime) -> HealthReport:
    """Act on fatal findings. Idempotent: a GPU already unhealthy and a workload already stopping are left alone,
    so a rule that keeps firing every sample produces one set of actions."""
    report = HealthReport()
    fatal = [f for f in findings if f.fatal]
    if not fatal:
        return report
    q = select(Node).where(Node.name.in_({f.node for f in fatal})).with_for_update()
    nodes = {n.name: n for n in s.scalars(q)}
    changed = False
    for f in fatal:
        node = nodes.get(f.node)
        if node is None:
            continue
        new = node.state == "ready"  # a node-level finding is news only on a node still taking work
        if f.gpu is not None:
            gpu = s.scalar(select(Gpu).where(Gpu.node_id == node.id, Gpu.index == f.gpu).with_for_update())
            if gpu is None:
                continue
            if gpu.healthy:
                gpu.healthy, gpu.health_reason, gpu.health_since = False, f.reason[:1000], now
                report.gpus_marked += 1
                new = True
        if new:
            note(s, node.id, f.gpu, f.rule, f.reason, now)
            changed = True
        if node.state == "ready":
            node.state, node.state_reason = "draining", f"health: {f.reason}"[:1000]
            note(s, node.id, None, "drained", f"no new work: {f.reason}", now)
            report.nodes_drained += 1
        # Every time, not only when the rule first fires: work placed on the failed hardware since (a placement
        # racing the finding) is stopped too. Workloads already stopping are left alone.
        stopped = _stop_holders(s, node.name, f.gpu, f.reason, now)
        if stopped and not new:
            note(s, node.id, f.gpu, f.rule, f"{f.reason}; stopped {', '.join(stopped)}", now)
        report.workloads_stopped += stopped
    if changed:
        inventory.bump_version(s, fleet=True)
    return report


def findings_of(
    judge: HealthJudge, samples: Sequence[GpuSample], index: FleetIndex, more: Sequence[Finding] = ()
) -> list[Finding]:
    """The health rules over a batch of samples, plus findings of the caller's (e.g. heartbeats). No I/O: the
    loop judges outside any write transaction and opens one only when `calls_for_action`."""
    return judge.judge(samples, index.models()) + list(more)


def calls_for_action(findings: Sequence[Finding]) -> bool:
    return any(f.fatal for f in findings)


def judge_and_apply(
    s: Session, judge: HealthJudge, samples: Sequence[GpuSample], index: FleetIndex, now: datetime
) -> tuple[list[Finding], HealthReport]:
    """`findings_of`, then `apply`, in the caller's transaction."""
    findings = findings_of(judge, samples, index)
    return findings, apply(s, findings, now)


def _stop_holders(s: Session, node: str, gpu: int | None, reason: str, now: datetime) -> list[str]:
    """Ask every workload holding the failed GPU (or any GPU of the failed node) to stop as a node failure."""
    stopped = []
    rows = s.execute(select(Allocation.workload, Allocation.placement).where(Allocation.stopped_at.is_(None))).all()
    for wid, placement in rows:
        held = (placement or {}).get(node)
        if held is None or (gpu is not None and gpu not in [int(g) for g in held]):
            continue
        w = s.get(Workload, wid, with_for_update=True)
        if w is None or w.state not in ("scheduled", "starting", "running") or w.stop_requested:
            continue
        where = f"{node} GPU {gpu}" if gpu is not None else node
        w.stop_requested = f"{NODE_FAILURE}{where}: {reason}"[:2000]
        workloads.event(s, w, f"stopping: {w.stop_requested}", now)
        stopped.append(w.id)
    return stopped


def credit_fault(s: Session, w: Workload, alloc: Allocation, now: datetime, why: str | None = None) -> Decimal:
    """Give back what the failed attempt was charged (its work is lost with it), as a refund naming the fault
    (`why`, else the stop request that named it). Keyed by the allocation, so a repeated finish credits once."""
    if alloc.stopped_at is None or alloc.rate_per_hour <= 0:
        return Decimal(0)
    # The seconds named are the seconds billed (and credited), by the metering rule: never "30 s" for 31 s paid.
    billed = billable_seconds(max(0.0, (alloc.stopped_at - alloc.started_at).total_seconds()), True)
    if alloc.billing_mode == usage.USAGE:  # what its readings were charged: settled now, so the credit matches it
        amount = usage.settle_now(s, alloc, now, DEFAULT_WINDOW_S)
    else:
        amount = cost_of(alloc.rate_per_hour, billed)
    if amount <= 0:
        return Decimal(0)
    memo = f"{w.name} ({w.id}): {billed} s lost to a hardware fault: {why or w.stop_requested or ''}"[:500]
    ledger.move(s, "refund", alloc.org_id, amount, f"fault-credit:{alloc.id}", now, memo, user_id=w.user_id)
    workloads.event(s, w, f"credited {amount.normalize():f} for {billed} s lost to the fault", now)
    return amount


# ---- repair and injection -------------------------------------------------------------------------------------
def repair(s: Session, node: Node, now: datetime) -> int:
    """The operator put the node back (`ready`): its GPUs count as healthy again and lasting injected faults end."""
    marked = s.execute(update(Gpu).where(Gpu.node_id == node.id, Gpu.healthy.is_(False))
                       .values(healthy=True, health_reason="", health_since=None)).rowcount or 0  # fmt: skip
    s.execute(update(InjectedFault).where(InjectedFault.node_id == node.id, InjectedFault.cleared_at.is_(None))
              .values(cleared_at=now))  # fmt: skip
    note(s, node.id, None, "ready", f"returned to service; {marked} GPU(s) marked healthy again", now)
    return marked


def set_state(s: Session, name: str, state: str, reason: str, now: datetime) -> Node:
    """The operator's drain, down or ready; `ready` after a fault is the repair. `down` takes the node out of
    service: the work on it stops as a node failure (requeued by its retry policy, the attempt credited)."""
    row = inventory.node(s, name)
    if state == "ready" and row.state != "ready":
        repair(s, row, now)
    elif state != row.state:
        note(s, row.id, None, state, reason or f"set {state} by the operator", now)
    if state == "down":
        stopped = _stop_holders(s, row.name, None, reason or "set down by the operator", now)
        if stopped:
            note(s, row.id, None, "down", f"stopped {', '.join(stopped)}", now)
    return inventory.set_state(s, name, state, reason)


def inject(s: Session, node_ref: str, gpu: int, kind: str, xid: int, now: datetime) -> InjectedFault:
    node = inventory.node(s, node_ref)
    if node.kind != "virtual":
        raise Invalid(f"node: {node.name} is a {node.kind} node; faults can only be injected into virtual nodes")
    if kind not in FAULT_KINDS:
        raise Invalid(f"kind: one of {', '.join(FAULT_KINDS)}")
    if not 0 <= gpu < node.gpu_count:
        raise Invalid(f"gpu: {node.name} has GPUs 0-{node.gpu_count - 1}")
    if kind == "xid" and xid <= 0:
        raise Invalid("xid: an XID fault needs the XID number (e.g. 79, fallen off the bus)")
    row = InjectedFault(node_id=node.id, gpu=gpu, kind=kind, xid=xid if kind == "xid" else 0, created_at=now)
    s.add(row)
    note(s, node.id, gpu, "injected", f"fault injected: {kind}{f' {xid}' if kind == 'xid' else ''}", now)
    s.flush()
    return row


def events(s: Session, node_id: str, limit: int = 200) -> list[NodeEvent]:
    q = select(NodeEvent).where(NodeEvent.node_id == node_id).order_by(NodeEvent.id.desc()).limit(limit)
    return list(reversed(list(s.scalars(q))))
