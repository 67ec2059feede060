"""What an org's quotas and plans let through to the cycle, walked before it as `money.committed` walks the balance.

Placement refuses work that would take an org past its GPU, CPU or memory quota, or a plan past its GPUs. If the
cycle saw that work it would hand it free GPUs, and preempt or shrink other orgs' work to make room, every pass, for
a placement then refused: the victims killed for nothing and the GPUs idle meanwhile. So each org's queue is walked
in its own order (class, then its place in the queue), adding each workload's least GPUs (an elastic one's minimum)
and host share to what the org holds, and each plan-billed one's to its plan's GPUs in use: work that would break a
quota or overfill its plan waits with the reason, unseen by the cycle, and is not counted (it does not block the
org's smaller work behind it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from suanli.control.money import metering
from suanli.db.models import Allocation, Org, Plan
from suanli.sched import Request
from suanli.workloads.spec import WorkloadSpec

QUOTA = "waiting for quota"


@dataclass(frozen=True)
class Limits:
    """The quotas of the queue's orgs that have any (with what each holds now), and the free GPUs of their active
    plans."""

    orgs: dict[str, tuple[Org, tuple[int, int, int]]]
    plans: dict[str, tuple[int, int]]  # plan -> (its GPUs, in use now)


def read(s: Session, org_ids: Iterable[str], now: datetime) -> Limits:
    """Two statements per 500 orgs for quotas, two for plans."""
    ids = sorted(set(org_ids))
    orgs: dict[str, tuple[Org, tuple[int, int, int]]] = {}
    plans: dict[str, tuple[int, int]] = {}
    a = Allocation
    for i in range(0, len(ids), 500):
        part = ids[i : i + 500]
        quota = or_(Org.quota_gpus.is_not(None), Org.quota_cpus.is_not(None), Org.quota_memory_gib.is_not(None))
        limited = {o.id: o for o in s.scalars(select(Org).where(Org.id.in_(part), quota))}
        held = {org: (int(g), int(c), int(m)) for org, g, c, m in s.execute(
            select(a.org_id, func.coalesce(func.sum(a.gpus), 0), func.coalesce(func.sum(a.cpu_milli), 0),
                   func.coalesce(func.sum(a.memory_mib), 0))
            .where(a.org_id.in_(list(limited)), a.stopped_at.is_(None)).group_by(a.org_id)
        )} if limited else {}  # fmt: skip
        orgs.update({o: (row, held.get(o, (0, 0, 0))) for o, row in limited.items()})
        active = {p.id: p.gpus for p in s.scalars(
            select(Plan).where(Plan.org_id.in_(part), Plan.starts_at <= now, Plan.ends_at > now))}  # fmt: skip
        if active:
            modes = {f"plan:{p}": p for p in active}
            used = dict(s.execute(
                select(a.billing_mode, func.coalesce(func.sum(a.gpus), 0))
                .where(a.billing_mode.in_(list(modes)), a.stopped_at.is_(None)).group_by(a.billing_mode)
            ).all())  # fmt: skip
            plans.update({p: (n, int(used.get(f"plan:{p}", 0))) for p, n in active.items()})
    return Limits(orgs, plans)


def within(
    queue: Sequence[Request], specs: Mapping[str, WorkloadSpec], limits: Limits
) -> tuple[list[Request], dict[str, str]]:
    """The queued requests the cycle may place (in the queue's order), and why each other one waits."""
    by_org: dict[str, list[Request]] = defaultdict(list)
    for r in queue:
        by_org[r.tenant].append(r)
    waits: dict[str, str] = {}
    plan_used = {p: used for p, (_, used) in limits.plans.items()}
    for org, reqs in by_org.items():
        quota = limits.orgs.get(org)
        held = list(quota[1]) if quota is not None else [0, 0, 0]
        for r in sorted(reqs, key=lambda x: (-x.rank, x.submit_time, x.id)):
            spec = specs.get(r.id)
            plan = spec.plan_id() if spec is not None else None
            least = r.min_gpus or r.gpus
            cpu = r.cpu_milli * least // r.gpus if r.gpus else r.cpu_milli
            mem = r.memory_mib * least // r.gpus if r.gpus else r.memory_mib
            if plan is not None:
                if plan not in limits.plans:
                    waits[r.id] = f"cannot start: plan {plan} is not active; resubmit with other billing"
                    continue
                size, _ = limits.plans[plan]
                if plan_used[plan] + least > size:
                    waits[r.id] = f"waits for plan {plan}: its {size} GPUs, {plan_used[plan]} in use or promised"
                    continue
            if quota is not None:
                why = metering.quota_refusal(quota[0], least, cpu, mem, (held[0], held[1], held[2]))
                if why is not None:
                    waits[r.id] = f"{QUOTA}: {why} (counting its work queued ahead)"
                    continue
                held[0], held[1], held[2] = held[0] + least, held[1] + cpu, held[2] + mem
            if plan is not None:
                plan_used[plan] += least
    if not waits:
        return list(queue), waits
    return [r for r in queue if r.id not in waits], waits
