"""Jobs and instances: submit, list, describe, logs, stop, start, scale."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ConfigDict, Field, StrictInt, model_validator
from sqlalchemy.orm import Session

from suanli.api.deps import Auth, Caller, in_thread
from suanli.api.schemas import In, Out, money
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.money import ZERO
from suanli.control.errors import Invalid, NotFound, ServiceError
from suanli.control.storage import hub, storage
from suanli.control.workloads import admission, resizing, workloads
from suanli.control.workloads import logs as workload_logs
from suanli.control.workloads.sandboxes import sandbox_policy
from suanli.db.models import Allocation, Workload, WorkloadEvent
from suanli.storage import workdirs
from suanli.workloads.resources import MAX_GPUS
from suanli.workloads.spec import MAX_SPEC_BYTES, WorkloadSpec

router = APIRouter(route_class=StrictJSONRoute, tags=["workloads"])
MAX_SPEC_CHARS = 256 * 1024
ON_LOOP_BYTES = 64 * 1024  # a JSON spec in a request this small is checked on the event loop (no thread hop)


class EnvironmentOut(Out):
    name: str


class WorkloadIn(In):
    model_config = ConfigDict(extra="forbid", str_max_length=128 << 20)
    spec: dict[str, Any] | None = Field(None, description="the workload spec as JSON")
    spec_yaml: str | None = Field(None, max_length=MAX_SPEC_CHARS, description="…or as YAML text")
    org: str | None = Field(None, max_length=64, description="the org that pays; default: your personal org")
    workdir_upload: str | None = Field(
        None, max_length=64, description="a job's workdir uploaded before (`POST /workdirs`): the id it returned"
    )
    workdir_archive: str | None = Field(
        None, description="…or base64 of a small .tar.gz of the job's workdir, the whole body within max_body_bytes"
    )

    @model_validator(mode="after")
    def _one_spec(self) -> WorkloadIn:
        if (self.spec is None) == (self.spec_yaml is None):
            raise ValueError("give exactly one of spec (JSON) or spec_yaml (YAML text)")
        if self.workdir_upload is not None and self.workdir_archive is not None:
            raise ValueError("give at most one of workdir_upload and workdir_archive")
        return self


class EventOut(Out):
    at: datetime
    state: str
    reason: str


class PendingOut(Out):
    reason: str
    position: int | None


class AllocationOut(Out):
    id: str
    gpu_model: str | None
    gpus: int
    milli: int
    nodes: dict[str, list[int]]
    rate_per_hour: str
    billing_mode: str
    started_at: datetime
    stopped_at: datetime | None
    cpu_milli: int = Field(0, description="host CPU held, 1000 a core (0: not asked for)")
    memory_mib: int = Field(0, description="host memory held (0: not asked for)")
    host_rate_per_hour: str = Field("0.00000000", description="the host CPU and memory part of rate_per_hour")


class WorkloadOut(Out):
    id: str
    name: str
    kind: str
    org_id: str
    user_id: str
    state: str
    reason: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    gpu: str | None
    gpus: int
    nodes: int
    attempt: int
    exit_code: int | None
    pending: PendingOut | None
    allocation: AllocationOut | None
    cost: str
    rate_per_hour: str
    currency: str
    events: list[EventOut] | None = None
    spec: dict[str, Any] | None = None
    scale_to: int | None = Field(None, description="the GPU count its owner scaled it to (`suanli scale`), if any")


class LogOut(Out):
    data: str
    next_offset: int
    done: bool


def _asked_gpus(w: Workload) -> int:
    """The GPUs its spec asks for; 0 for a spec stored before a check it would fail now (shown, never a 500)."""
    try:
        return workloads.spec_of(w).gpu_count()
    except ValueError:
        return 0


def _out(
    w: Workload, allocs: list[Allocation], now: datetime, currency: str, events: list[WorkloadEvent] | None = None
) -> WorkloadOut:
    current = next((a for a in allocs if a.id == w.allocation_id), None)
    spec = w.spec
    res = spec.get("resources", {})
    gpus = current.gpus if current is not None else _asked_gpus(w)
    alloc = None
    if current is not None:
        alloc = AllocationOut(
            id=current.id, gpu_model=current.gpu_model, gpus=current.gpus, milli=current.milli,
            nodes=current.placement, rate_per_hour=money(current.rate_per_hour), billing_mode=current.billing_mode,
            started_at=current.started_at, stopped_at=current.stopped_at, cpu_milli=current.cpu_milli,
            memory_mib=current.memory_mib, host_rate_per_hour=money(current.host_rate_per_hour),
        )  # fmt: skip
    gpu = current.gpu_model if current is not None else res.get("gpu")
    return WorkloadOut(
        id=w.id, name=w.name, kind=w.kind, org_id=w.org_id, user_id=w.user_id, state=w.state, reason=w.reason,
        created_at=w.created_at, started_at=w.started_at, finished_at=w.finished_at,
        gpu=gpu if isinstance(gpu, str) else ",".join(gpu) if gpu else None, gpus=gpus,
        nodes=len(current.placement) if current is not None else int(res.get("nodes") or 0),
        attempt=w.attempt, exit_code=w.exit_code,
        pending=PendingOut(reason=w.pending_reason, position=w.queue_position) if w.state == "pending" else None,
        allocation=alloc, cost=money(workloads.cost(allocs, now)),
        rate_per_hour=money(current.rate_per_hour if current is not None and current.stopped_at is None else ZERO),
        currency=currency,
        events=[EventOut(at=e.at, state=e.state, reason=e.reason) for e in events] if events is not None else None,
        spec=spec if events is not None else None, scale_to=w.scale_to,
    )  # fmt: skip


def _full(s: Session, w: Workload, ctx: Caller) -> WorkloadOut:
    """One workload with its allocations and events."""
    allocs = workloads.allocations_of(s, [w.id]).get(w.id, [])
    return _out(w, allocs, ctx.now, ctx.srv.settings.currency, workloads.events(s, w.id))


@router.get("/environments")
def environments(ctx: Auth) -> list[EnvironmentOut]:
    """The environments the operator published, for a spec's `image:` (names only: paths are the host's)."""
    return [EnvironmentOut(name=n) for n in sorted(ctx.srv.settings.environments)]


@router.post("/workloads", status_code=201)
async def submit(request: Request, body: WorkloadIn, ctx: Auth) -> WorkloadOut:
    """Submit a job or start an instance. The spec is checked here (422 naming the field); the balance must cover
    the admission hold (402); the scheduler places it on its next pass. A job's workdir comes as `workdir_upload`
    (uploaded before; the submission uses it up, admitted or refused) or inline as `workdir_archive`."""
    try:
        if body.spec is not None and _length(request) <= ON_LOOP_BYTES:
            spec = admission.parse(body.spec)
        else:  # YAML text, or a large body: checked in a thread, not on the event loop every request shares
            spec = await run_in_threadpool(_parse, body)
        if spec.image is not None or spec.jupyter:  # a few stat calls: fine on the event loop
            policy = sandbox_policy(ctx.srv.settings)
            policy.check_image(spec)
            policy.check_jupyter(spec)
        if spec.models or spec.datasets:  # names the hub must hold: a read in a thread
            await run_in_threadpool(_check_hub, ctx, spec)
    except ServiceError:
        if body.workdir_upload is not None:
            await run_in_threadpool(_forfeit, body.workdir_upload, ctx)
        raise
    if body.workdir_archive is None and body.workdir_upload is None:  # checked and written with the rest meanwhile
        row = await ctx.srv.submissions.write_async(admission.Submission(ctx.who, spec, ctx.now, body.org))
    else:
        row = await run_in_threadpool(_admit_upload, body, spec, ctx)
    return _submitted(row, spec, ctx)


def _check_hub(ctx: Caller, spec: WorkloadSpec) -> None:
    with ctx.db.read() as s:
        hub.check_spec(s, spec)


def _length(request: Request) -> int:
    try:
        return int(request.headers["content-length"])
    except (KeyError, ValueError):
        return ON_LOOP_BYTES + 1  # chunked: could be anything


def _parse(body: WorkloadIn) -> WorkloadSpec:
    if body.spec is None:
        return admission.parse(body.spec_yaml or "")
    size = len(json.dumps(body.spec, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:  # the limit of a YAML spec, too
        raise Invalid(f"spec: is {size} bytes as JSON; the limit is {MAX_SPEC_BYTES // 1024} KiB")
    return admission.parse(body.spec)


def _submitted(row: dict[str, Any], spec: WorkloadSpec, ctx: Caller) -> WorkloadOut:
    """What `describe` would show of a workload just queued (built from its row: no session, no spec parse)."""
    res = row["spec"].get("resources", {})
    gpu = res.get("gpu")
    return WorkloadOut(
        id=row["id"], name=row["name"], kind=row["kind"], org_id=row["org_id"], user_id=row["user_id"],
        state=row["state"], reason=row["reason"], created_at=row["created_at"], started_at=None, finished_at=None,
        gpu=gpu if isinstance(gpu, str) else ",".join(gpu) if gpu else None, gpus=spec.gpu_count(),
        nodes=int(res.get("nodes") or 0), attempt=row["attempt"], exit_code=None,
        pending=PendingOut(reason=row["pending_reason"], position=row["queue_position"]), allocation=None,
        cost=money(ZERO), rate_per_hour=money(ZERO), currency=ctx.srv.settings.currency,
        events=[EventOut(at=row["created_at"], state="pending", reason="submitted")], spec=row["spec"],
    )  # fmt: skip


def _admit_upload(body: WorkloadIn, spec: WorkloadSpec, ctx: Caller) -> dict[str, Any]:
    """Check a submission with a workdir and queue it in a transaction of its own (moving the upload into place is
    a rename that must not be retried in a batch). The upload is used up whether the submission is admitted or
    refused; only the caller's own upload can be named."""
    store = storage.Store.of(ctx.srv.settings)
    if body.workdir_archive is not None:
        try:
            archive = base64.b64decode(body.workdir_archive, validate=True)
        except (binascii.Error, ValueError) as e:
            raise Invalid("workdir_archive: not valid base64") from e
        if spec.kind != "job":
            raise Invalid("workdir_archive: only a job uploads a workdir; an instance keeps its own disk")
        upload_id = storage.upload(ctx.db, ctx.who, body.org, archive, store, ctx.now, field="workdir_archive").id
    else:
        assert body.workdir_upload is not None
        upload_id = body.workdir_upload
        with ctx.db.read() as s:
            storage.staged(s, ctx.who, upload_id, ctx.now)  # another's upload: 404, and left alone
    queued: str | None = None
    try:
        field = "workdir_archive" if body.workdir_archive is not None else "workdir_upload"
        if spec.kind != "job":
            raise Invalid(f"{field}: only a job uploads a workdir; an instance keeps its own disk")
        staged = workdirs.staged_dir(store.home, upload_id)
        with ctx.db.read() as s:
            wd = storage.staged(s, ctx.who, upload_id, ctx.now)
            row = admission.admit(s, ctx.who, spec, ctx.now, hold_minutes=ctx.srv.settings.admission_hold_minutes,
                                  fleet=ctx.srv.fleet, prices=ctx.srv.prices, org_id=body.org, workdir=staged,
                                  max_queued=ctx.srv.settings.max_queued_per_org)  # fmt: skip
        if row["org_id"] != wd.org_id:
            raise Invalid(f"{field}: uploaded for another organisation than the one that pays (upload with its org)")
        queued = row["id"]
        with ctx.db.write() as s, s.begin():
            storage.lock_staged(s, upload_id)
            admission.enqueue(s, row, home=store.home, workdir=staged)
            storage.claim(s, upload_id, row["id"])
    except BaseException:
        storage.drop(ctx.db, upload_id, store.home, queued)
        raise
    return row


def _forfeit(upload_id: str, ctx: Caller) -> None:
    """A submission naming the caller's upload was refused before it reached the upload: the upload is used up."""
    with ctx.db.read() as s:
        try:
            storage.staged(s, ctx.who, upload_id, ctx.now)
        except NotFound:
            return
    storage.drop(ctx.db, upload_id, ctx.srv.settings.home)


@router.get("/workloads")
@in_thread
def list_workloads(
    ctx: Auth,
    all: bool = Query(False, description="include finished workloads"),
    org: str | None = Query(None, max_length=64),
) -> list[WorkloadOut]:
    with ctx.db.read() as s:
        rows = workloads.listing(s, ctx.who, all=all, org_id=org)
        allocs = workloads.allocations_of(s, [w.id for w in rows])
        return [_out(w, allocs.get(w.id, []), ctx.now, ctx.srv.settings.currency) for w in rows]


@router.get("/workloads/{ref}")
@in_thread
def describe(ref: str, ctx: Auth) -> WorkloadOut:
    """Everything about one workload (by id, or by name: the newest of that name): state, events, where it runs,
    what it cost, and while pending the scheduler's reason and queue position."""
    with ctx.db.read() as s:
        return _full(s, workloads.get(s, ctx.who, ref), ctx)


@router.get("/workloads/{ref}/logs")
@in_thread
def logs(
    ref: str,
    ctx: Auth,
    offset: int = Query(0, ge=0, le=1 << 50),
    rank: int = Query(0, ge=0, le=8192),
    limit: int = Query(1 << 20, ge=1, le=8 << 20),
) -> LogOut:
    """A chunk of a node-rank's log from `offset`; `done` once the workload has ended and the log is read out."""
    with ctx.db.read() as s:
        w = workloads.get(s, ctx.who, ref)
        workload_logs.check_rank(s, w, rank)
    data, nxt, eof = workload_logs.read(ctx.srv.settings.home, w, rank, offset, limit)
    finished = w.state not in workloads.ACTIVE
    return LogOut(data=data, next_offset=nxt, done=finished and eof)


@router.post("/workloads/{ref}/stop")
@in_thread
def stop(ref: str, ctx: Auth) -> WorkloadOut:
    """Stop it: at once while pending; a running one gets SIGTERM, then SIGKILL after the grace period."""
    with ctx.db.write() as s, s.begin():
        return _full(s, workloads.stop(s, ctx.who, ref, ctx.now), ctx)


class StartIn(In):
    no_gpu: bool = False  # run CPU-only to reach the disk at CPU price; the GPUs come back on the next start


@router.post("/workloads/{ref}/start")
@in_thread
def start(ref: str, ctx: Auth, body: StartIn = StartIn()) -> WorkloadOut:
    """Start a stopped instance again (it queues; its disk is as it was); `no_gpu`: CPU-only this time."""
    with ctx.db.write() as s, s.begin():
        w = workloads.start(s, ctx.who, ref, ctx.now, no_gpu=body.no_gpu,
                            max_queued=ctx.srv.settings.max_queued_per_org)  # fmt: skip
        return _full(s, w, ctx)


class ScaleIn(In):
    gpus: StrictInt = Field(ge=1, le=MAX_GPUS, description="GPUs to run on, within the spec's {min, max}")


@router.post("/workloads/{ref}/scale")
@in_thread
def scale(ref: str, body: ScaleIn, ctx: Auth) -> WorkloadOut:
    """Resize running elastic work to `gpus` (422 outside its spec's range; 409 for rigid work or work not running).
    The next scheduling pass carries it out: a shrink keeps a subset of its GPUs, a grow is placed topology-aware or
    waits (its events say why) until the GPUs are free. Its ranks restart with the new world size and
    SUANLI_RESTART_REASON=resize; billing is at the new size from that second. It stays at that size until it ends."""
    with ctx.db.write() as s, s.begin():
        return _full(s, resizing.scale(s, ctx.who, ref, body.gpus, ctx.now), ctx)
