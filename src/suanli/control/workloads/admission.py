"""Admission: what a submission is checked against before it is queued, and the insert that queues it.

A spec is checked against the inventory (a GPU model that could run it), the price book (its rate, under the
spec's price ceiling), the org's plans, quotas, queue and balance, and the caller's role and spend limit; the row
it becomes is inserted with its first event. The checks only read, so they run before the write transaction (the
API's group commit batches the inserts); the scheduler checks quota and balance again when it places the workload.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import BigInteger, Integer, String, column, insert, select, text
from sqlalchemy.orm import Session

from suanli import catalog
from suanli.billing.ledger import org_account
from suanli.billing.money import ZERO, exact
from suanli.billing.prices import PriceBook
from suanli.control.accounts import memberships, spend_limits
from suanli.control.accounts.accounts import Principal
from suanli.control.caches import FleetCache, ModelCapacity, PriceCache
from suanli.control.errors import Conflict, Invalid, NotFound, PaymentRequired
from suanli.control.ids import new_id
from suanli.control.scheduling import inventory
from suanli.control.storage import volumes
from suanli.control.workloads import precision
from suanli.db.columns import MONEY
from suanli.db.models import Node, Plan, Workload, WorkloadEvent
from suanli.storage import workdirs
from suanli.workloads.host import cores, gib, host_text
from suanli.workloads.spec import SpecError, WorkloadSpec, parse_spec

MAX_QUEUED = 1000  # pending workloads an org may have at once (settings `max_queued_per_org`)


@dataclass(frozen=True)
class Candidate:
    gpu_model: str  # "" for CPU-only work
    rate_per_hour: Decimal  # all of it
    host_rate_per_hour: Decimal = ZERO  # its host CPU and memory part


def candidates(
    s: Session, spec: WorkloadSpec, org_id: str, now: datetime, fleet: dict[str, ModelCapacity], book: PriceBook
) -> list[Candidate]:
    """GPU models that could run it (registered, enough GPUs, priced, under the price ceiling), cheapest rate
    first within the spec's preference, each at its whole hourly rate (GPUs and host CPU and memory); a clear
    4xx when there are none."""
    want = spec.gpu_count()
    host_cpu, host_mem = spec.host_request()
    mode = spec.billing_mode()
    host = book.host_rate(host_cpu, host_mem, "spot" if mode == "spot" else "on-demand")
    if want == 0:
        if s.scalar(select(Node.id).where(Node.state != "down").limit(1)) is None:
            raise Invalid("resources: no node is registered to run it on")
        if spec.max_price_per_hour is not None and host > spec.max_price_per_hour:
            raise Invalid(f"max_price_per_hour: {host_text(host_cpu, host_mem)} cost {host:.2f}/h, above the ceiling "
                          f"{spec.max_price_per_hour}")  # fmt: skip
        return [Candidate("", host, host)]
    precision.check_pinned(spec)
    registered = {m: (c.largest_gang(), c.per_node) for m, c in fleet.items()}
    preference = spec.gpu_preference() or tuple(precision.fitting(spec, sorted(registered)))
    models = [m for m in preference if m in registered]
    if not registered:
        raise Invalid("resources.gpus: no registered node has a GPU (GPUs on offer: none)")
    if not models:
        on_offer = ", ".join(sorted(registered)) or "none"
        raise Invalid(f"resources.gpu: no registered node has {' or '.join(preference)}; GPUs on offer: {on_offer}")
    if spec.resources.slice is not None:  # only models that offer the MIG profile (the spec checks named ones)
        models = [m for m in models if spec.resources.slice in catalog.gpu(m).mig_profiles]
        if not models:
            raise Invalid(f"resources.slice: no registered GPU offers MIG profile {spec.resources.slice}; GPUs on "
                          f"offer: {', '.join(sorted(registered))}")  # fmt: skip
    biggest = max(registered[m][0] for m in models)
    if want > biggest:
        raise Invalid(f"resources.gpus: needs {want} GPUs; the most of {' or '.join(models)} in one cluster is "
                      f"{biggest} (a gang runs inside one cluster)")  # fmt: skip
    models = [m for m in models if registered[m][0] >= want]
    cpu, mem = spec.resources.cpu_milli(), spec.resources.memory_mib()
    if cpu or mem:
        least = want  # the count, or an elastic range's minimum
        carried = {m: fleet[m].carries(want, cpu, mem) for m in models}
        if max(carried.values()) < least:
            cpu_alone = max(fleet[m].carries(want, cpu, 0) for m in models)
            field = "cpus" if cpu and cpu_alone < least else "memory"
            raise Invalid(f"resources.{field}: the nodes with {' or '.join(models)} have the CPU and memory for at "
                          f"most {max(carried.values())} of its {least} GPUs ({spec.resources.cpus or 0:g} cores and "
                          f"{mem} MiB for {want}), even when idle")  # fmt: skip
        models = [m for m in models if carried[m] >= least]
    nodes = spec.resources.nodes
    if nodes:  # a share per node larger than any node would wait forever
        share, most = -(-want // nodes), max(fleet[m].per_node for m in models)
        if share > most:
            if nodes == 1 and spec.network in ("private", "none"):
                raise Invalid(f"network: {spec.network} runs on one node, and {want} GPUs never fit in one node here (at "
                              f"most {most} of {' or '.join(models)}); ask for fewer GPUs or network: host")  # fmt: skip
            raise Invalid(f"resources.nodes: {share} GPUs on each node never fit here (at most {most} of "
                          f"{' or '.join(models)} in a node); ask for more nodes or fewer GPUs")  # fmt: skip
        models = [m for m in models if fleet[m].per_node >= share]
    topology = spec.resources.topology
    if topology in ("nvlink", "leaf"):
        per = {m: fleet[m].per_nvlink if topology == "nvlink" else fleet[m].per_leaf for m in models}
        if want > max(per.values()):
            where = "one NVLink domain" if topology == "nvlink" else "one leaf switch"
            raise Invalid(f"resources.topology: {want} GPUs never fit in {where} here (at most {max(per.values())}"
                          f" of {' or '.join(models)}); ask for topology: any or fewer GPUs")  # fmt: skip
        models = [m for m in models if per[m] >= want]
    plan = _plan(s, spec, org_id, now)
    out: list[Candidate] = []
    for m in models:
        if plan is not None:
            if m == plan.gpu_model:
                out.append(Candidate(m, host, host))  # the plan prepaid its GPUs, not the host's cores and memory
            continue
        if not book.offered(m, mode if mode != "plan" else "on-demand"):
            continue
        gpu_rate = book.rate(m, want, mode, spec.milli())  # type: ignore[arg-type]
        out.append(Candidate(m, exact(gpu_rate + host), host))
    if plan is not None and not out:
        raise Invalid(f"billing: plan {plan.id} reserves {plan.gpu_model}, which resources.gpu does not allow")
    if not out:
        what = "usage price" if mode == "usage" else "price"
        raise Invalid(f"resources.gpu: {', '.join(models)} has no {what}; the operator has not put it up for rent"
                      f"{' billed by usage' if mode == 'usage' else ''}")  # fmt: skip
    ceiling = spec.max_price_per_hour
    if ceiling is not None:
        affordable = [c for c in out if c.rate_per_hour <= ceiling]
        if not affordable:
            cheapest = min(out, key=lambda c: c.rate_per_hour)
            with_host = f" with {host_text(host_cpu, host_mem)}" if host_cpu or host_mem else ""
            raise Invalid(
                f"max_price_per_hour: {want} x {cheapest.gpu_model}{with_host} costs {cheapest.rate_per_hour:.2f}/h, "
                f"above the ceiling {ceiling}"
            )
        out = affordable
    return out


def _plan(s: Session, spec: WorkloadSpec, org_id: str, now: datetime) -> Plan | None:
    plan_id = spec.plan_id()
    if plan_id is None:
        return None
    plan = s.get(Plan, plan_id)
    if plan is None or plan.org_id != org_id:
        raise Invalid(f"billing: plan {plan_id} is not a plan of this organisation")
    if not plan.starts_at <= now < plan.ends_at:
        raise Invalid(f"billing: plan {plan_id} is not active (it ended {plan.ends_at:%Y-%m-%d %H:%M} UTC)")
    most = spec.gpu_range()[1] if spec.gpu_range() else spec.gpu_count()
    if most > plan.gpus:
        raise Invalid(f"resources.gpus: plan {plan_id} reserves {plan.gpus} GPUs; this may use {most}")
    return plan


@dataclass(frozen=True)
class SubmitContext:
    """Everything a submission reads, in one statement: the price-book and fleet versions (the caches key on
    them) and the paying org's quota, balance and the hourly rate of what it already runs."""

    price_version: int
    fleet_version: int
    org_name: str
    quota_gpus: int | None
    balance: Decimal
    open_rate: Decimal
    quota_cpus: int | None = None
    quota_memory_gib: int | None = None
    queued: int = 0  # its pending workloads, counted up to the cap


# One round trip, and plain SQL: building this as an expression on every submission cost more than running it.
_CONTEXT = text(
    """
    SELECT (SELECT id FROM price_books ORDER BY id DESC LIMIT 1) AS price_version,
           (SELECT value FROM kv WHERE "key" = :fleet_key) AS fleet_version,
           o.name AS name, o.quota_gpus AS quota_gpus, o.quota_cpus AS quota_cpus,
           o.quota_memory_gib AS quota_memory_gib,
           (SELECT balance FROM account_balances WHERE account = :account) AS balance,
           (SELECT COALESCE(SUM(rate_per_hour), 0) FROM allocations
             WHERE org_id = :org AND stopped_at IS NULL) AS open_rate,
           (SELECT COUNT(*) FROM (SELECT 1 FROM workloads
             WHERE org_id = :org AND state = 'pending' LIMIT :queue_cap) q) AS queued
      FROM orgs o WHERE o.id = :org
    """
).columns(
    column("price_version", Integer), column("fleet_version", BigInteger), column("name", String),
    column("quota_gpus", Integer), column("quota_cpus", Integer), column("quota_memory_gib", Integer),
    column("balance", MONEY), column("open_rate", MONEY), column("queued", Integer),
)  # fmt: skip


def _context(s: Session, org_id: str, queue_cap: int = MAX_QUEUED) -> SubmitContext:
    args = {"fleet_key": inventory.FLEET_VERSION, "account": org_account(org_id), "org": org_id, "queue_cap": queue_cap}
    row = s.execute(_CONTEXT, args).one_or_none()
    if row is None:
        raise NotFound(f"organisation {org_id} not found")
    return SubmitContext(row.price_version or 0, row.fleet_version or 0, row.name, row.quota_gpus,
                         exact(Decimal(row.balance or 0)), exact(Decimal(row.open_rate or 0)), row.quota_cpus,
                         row.quota_memory_gib, int(row.queued or 0))  # fmt: skip


def _check_queue(ctx: SubmitContext, max_queued: int) -> None:
    """Refuse work past `max_queued` waiting workloads of the org: a submission's balance check counts only
    running work, so without a bound a tenant could queue without end, and every scheduling pass walks the queue.
    (Advisory like the other checks: submissions in flight at once may each see room for one more.)"""
    if ctx.queued >= max_queued:
        raise Conflict(f"queue: {ctx.org_name} has {ctx.queued} workloads waiting, the most an organisation may "
                       "(max_queued_per_org); wait for some to start, or stop some")  # fmt: skip


def _precheck_money(ctx: SubmitContext, spec: WorkloadSpec, rate: Decimal, hold_minutes: int) -> None:
    """Refuse at once what could never start: a gang over one of the org's quotas (GPUs, host CPU cores, host
    memory), or a balance that does not cover the admission hold. (The scheduler checks again when it places the
    workload: the balance may have changed.)"""
    gpus = spec.gpu_count()
    if ctx.quota_gpus is not None and gpus > ctx.quota_gpus:
        raise Conflict(f"resources.gpus: {ctx.org_name} may hold {ctx.quota_gpus} GPUs at once; this asks for {gpus}")
    cpu, mem = spec.host_request()
    if ctx.quota_cpus is not None and cpu > ctx.quota_cpus * 1000:
        raise Conflict(f"resources.cpus: {ctx.org_name} may hold {ctx.quota_cpus} CPU cores at once; this asks for "
                       f"{cores(cpu)}")  # fmt: skip
    if ctx.quota_memory_gib is not None and mem > ctx.quota_memory_gib * 1024:
        raise Conflict(f"resources.memory: {ctx.org_name} may hold {ctx.quota_memory_gib} GiB of memory at once; "
                       f"this asks for {gib(mem)} GiB")  # fmt: skip
    need = exact((ctx.open_rate + rate) * hold_minutes / 60)
    if rate > 0 and ctx.balance < need:
        raise PaymentRequired(
            f"balance {ctx.balance:.2f} does not cover {hold_minutes} minutes at {rate:.2f}/h plus running work "
            f"({need:.2f} needed); top up first"
        )


def parse(source: str | dict[str, Any]) -> WorkloadSpec:
    try:
        return parse_spec(source)
    except SpecError as e:
        raise Invalid(str(e)) from e


_INSERT_WORKLOAD = insert(Workload.__table__)
_INSERT_EVENT = insert(WorkloadEvent.__table__)


def admit(
    s: Session,
    who: Principal,
    spec: WorkloadSpec,
    now: datetime,
    *,
    hold_minutes: int,
    fleet: FleetCache,
    prices: PriceCache,
    org_id: str | None = None,
    workdir: Path | None = None,
    max_queued: int = MAX_QUEUED,
) -> dict[str, Any]:
    """Check a submission against the inventory, the price book, the org's quota and balance, and return the row
    to queue. Only reads, so it runs outside the write transaction: on SQLite a submission then holds the single
    write lock for two inserts, not for its checks. (The checks are advisory: the scheduler checks quota and
    balance again when it places the workload.) The caller's personal org needs no membership check; in a team org
    the caller's role must let them submit and spend, within their monthly spend limit."""
    access = None
    if org_id is not None and org_id != who.personal_org_id:
        access = memberships.require(s, who, org_id, "submit", "spend")
        org_id = access.org.id
    org_id = org_id or who.personal_org_id
    ctx = _context(s, org_id, max_queued)
    _check_queue(ctx, max_queued)
    book = prices.book(s, ctx.price_version)
    on_offer = fleet.models_at(s, ctx.fleet_version)
    found = candidates(s, spec, org_id, now, on_offer, book)
    rate = min(c.rate_per_hour for c in found)
    _precheck_money(ctx, spec, rate, hold_minutes)
    if access is not None:
        spend_limits.check_spend(s, who, access, now, rate=rate, hold_minutes=hold_minutes)
    if spec.volumes:
        volumes.check_spec_mounts(s, who, org_id, spec.volumes)
    if workdir is not None and spec.kind != "job":
        raise Invalid("workdir_archive: only a job uploads a workdir; an instance keeps its own disk")
    if workdir is not None and not (workdir / spec.workdir).is_dir():
        raise Invalid(f"workdir: {spec.workdir!r} is not a directory of the uploaded files")
    doc = spec.model_dump(mode="json", exclude_none=True)
    ceiling = spec.max_price_per_hour is not None or spec.plan_id() is not None
    if spec.gpu_count() > 0 and (ceiling or precision.narrows(spec, list(on_offer))):
        doc["resources"]["gpu"] = [c.gpu_model for c in found]  # the models within the ceiling, the plan or the
        # precision (its tensor cores: the scheduler places `gpu: any` work on any model otherwise)
        _still_valid(doc)
    return dict(
        id=new_id("wl"), org_id=org_id, user_id=who.user_id, name=spec.name, kind=spec.kind,
        spec=doc, state="pending", reason="submitted", pending_reason="waiting for the next scheduling cycle",
        queue_position=None, attempt=0, retries=0, allocation_id=None, executor="", handle=None, exit_code=None,
        stop_requested=None, has_workdir=workdir is not None, attained_gpu_s=0.0, created_at=now,
        submitted_at=now, queued_at=now, started_at=None, finished_at=None, deadline_at=None, ends_at=None, predicted_s=None,
    )  # fmt: skip


def _still_valid(doc: dict[str, Any]) -> None:
    """What is stored must read back: a spec the scheduling pass cannot parse is one workload's failure there, and
    must not be stored at all (a 422 naming the field)."""
    try:
        WorkloadSpec.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "resources"
        raise Invalid(f"{where}: {first.get('msg', 'invalid')}") from None


@dataclass(frozen=True)
class Submission:
    """A parsed submission waiting for its checks and its insert (by the API's group commit)."""

    who: Principal
    spec: WorkloadSpec
    now: datetime
    org_id: str | None = None


@dataclass(frozen=True)
class Admission:
    """How a process admits submissions: its settings and caches (`admit` in a group commit's prepare step)."""

    hold_minutes: int
    fleet: FleetCache
    prices: PriceCache
    max_queued: int = MAX_QUEUED

    def __call__(self, s: Session, sub: Submission) -> dict[str, Any]:
        return admit(s, sub.who, sub.spec, sub.now, hold_minutes=self.hold_minutes, fleet=self.fleet,
                     prices=self.prices, org_id=sub.org_id, max_queued=self.max_queued)  # fmt: skip


def enqueue_many(s: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Queue admitted workloads in the caller's write transaction: two statements however many there are (the
    API's group commit hands in every submission that arrived while the previous batch was being written)."""
    # Core inserts: the ORM's unit of work costs more than the rest of a submission together.
    s.execute(_INSERT_WORKLOAD, list(rows))
    s.execute(_INSERT_EVENT, [{"workload_id": r["id"], "at": r["created_at"], "state": "pending",
                               "reason": "submitted"} for r in rows])  # fmt: skip


def enqueue(s: Session, row: dict[str, Any], *, home: Path, workdir: Path) -> None:
    """Queue an admitted workload with its uploaded workdir, in the caller's write transaction."""
    enqueue_many(s, [row])
    workdirs.adopt(workdir, workdirs.upload_dir(home, row["id"]))  # a rename: the upload was unpacked before
