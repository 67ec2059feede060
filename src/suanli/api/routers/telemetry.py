"""GPU telemetry: samples in (node agents), series out (operators: any node; tenants: their workloads' GPUs while
they held them), the cluster summary, health events and fault injection, and `/metrics` for Prometheus."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import Field

from suanli.api.deps import Auth, Caller, Srv, in_thread
from suanli.api.routers.admin import Admin
from suanli.api.routers.agent_tokens import Reporting
from suanli.api.schemas import In, Out
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.errors import Invalid
from suanli.control.scheduling import inventory
from suanli.control.telemetry import agent_tokens, health, observe, telemetry
from suanli.control.workloads import workloads
from suanli.telemetry import exposition
from suanli.telemetry.samples import GpuSample

router = APIRouter(route_class=StrictJSONRoute, tags=["telemetry"])
MAX_BATCH = 20_000
MAX_AHEAD_S = 300  # a sample dated further in the future is a wrong clock, refused


Since = Annotated[datetime | None, Query(description="start (ISO 8601); default: 15 minutes before `until`")]
Until = Annotated[datetime | None, Query(description="end (ISO 8601); default: now")]
Resolution = Annotated[
    Literal["auto", "raw", "1m", "1h"],
    Query(description="raw samples, or per-minute / per-hour min-avg-max; auto: the finest that covers the range"),
]


class SampleIn(In):
    node: str = Field(min_length=1, max_length=255)
    gpu: int = Field(ge=0, le=1023)
    uuid: str = Field("", max_length=96)
    t: float = Field(gt=0, lt=1e11, description="epoch seconds of the reading")
    util: float = Field(0.0, ge=0, le=100)
    mem_used_mib: int = Field(0, ge=0, le=1 << 40)
    mem_total_mib: int = Field(0, ge=0, le=1 << 40)
    temp_c: float = Field(0.0, ge=-100, le=300)
    power_w: float = Field(0.0, ge=0, le=100_000)
    power_limit_w: float = Field(0.0, ge=0, le=100_000)
    sm_clock_mhz: int = Field(0, ge=0, le=100_000)
    throttle: int = Field(0, ge=0, le=(1 << 63) - 1)
    ecc_sbe: int = Field(0, ge=0, le=(1 << 63) - 1)
    ecc_dbe: int = Field(0, ge=0, le=(1 << 63) - 1)
    xid: int = Field(0, ge=0, le=1_000_000)
    error: str = Field("", max_length=500)


class SamplesIn(In):
    samples: list[SampleIn] = Field(max_length=MAX_BATCH)


class IngestOut(Out):
    stored: int = Field(description="samples accepted (one repeating a stored GPU and millisecond is ignored)")
    late: int = Field(description="samples whose minute was already rolled up: in raw series only")
    unknown: list[str] = Field(description="node/gpu of samples for GPUs nobody registered (first 20)")
    findings: list[str] = Field(description="fatal health findings these samples raised")


class FaultIn(In):
    gpu: int = Field(ge=0, le=1023)
    kind: Literal["overtemp", "xid", "ecc_dbe", "off_bus", "silent"]
    xid: int = Field(0, ge=0, le=1_000_000, description="the XID number, for kind xid")


class NodeEventOut(Out):
    at: datetime
    gpu: int | None
    kind: str
    reason: str


@router.post("/telemetry/samples")
@in_thread
def ingest(body: SamplesIn, ctx: Reporting) -> IngestOut:
    """Store a node agent's batch of GPU samples (a retried batch stores nothing twice) and act on its health. An
    operator's token posts for any node; a node's agent token (`suanli admin agent-tokens create`) for its own."""
    agent_tokens.check_nodes(ctx.node, [x.node for x in body.samples])
    srv = ctx.srv
    ahead = next((i for i, x in enumerate(body.samples) if x.t > ctx.now.timestamp() + MAX_AHEAD_S), None)
    if ahead is not None:
        raise Invalid(
            f"samples.{ahead}.t: more than {MAX_AHEAD_S} s ahead of the server's clock; check the agent's clock"
        )
    samples = [GpuSample(**x.__dict__) for x in body.samples]
    with ctx.db.write() as s, s.begin():
        index = srv.fleet_index.refresh(s)
        report, _ = telemetry.ingest(s, samples, index)
        findings, _ = health.judge_and_apply(s, srv.judge, samples, index, ctx.now)
    return IngestOut(stored=report.stored, late=report.late, unknown=report.unknown[:20],
                     findings=[f"{f.node}/{f.gpu}: {f.reason}" for f in findings if f.fatal])  # fmt: skip


@router.get("/nodes/{node}/metrics")
@in_thread
def node_metrics(node: str, ctx: Admin, since: Since = None, until: Until = None, resolution: Resolution = "auto"
                 ) -> dict[str, Any]:  # fmt: skip
    """Every GPU of the node over a time range."""
    with ctx.db.read() as s:
        return observe.node_metrics(
            s, node, since, until, resolution, ctx.now, telemetry.retention_of(ctx.srv.settings)
        )


@router.get("/workloads/{ref}/metrics")
@in_thread
def workload_metrics(ref: str, ctx: Auth, since: Since = None, until: Until = None, resolution: Resolution = "auto"
                     ) -> dict[str, Any]:  # fmt: skip
    """The GPUs the workload held, each only while it held them (every attempt)."""
    with ctx.db.read() as s:
        w = workloads.get(s, ctx.who, ref)
        return observe.workload_metrics(
            s, w, since, until, resolution, ctx.now, telemetry.retention_of(ctx.srv.settings)
        )


def _latest(ctx: Caller) -> list[telemetry.Latest]:
    with ctx.db.read() as s:
        return telemetry.latest(s, ctx.now, ctx.srv.settings.telemetry_stale_s)


@router.get("/admin/gpus")
@in_thread
def gpus(ctx: Admin) -> list[dict[str, Any]]:
    """Every GPU with its newest reading, health and holder: what `suanli admin top` draws."""
    return observe.gpu_rows(_latest(ctx), ctx.now)


@router.get("/cluster/summary")
@in_thread
def cluster_summary(ctx: Admin) -> dict[str, Any]:
    """Allocation, utilisation, the temperature distribution, unhealthy GPUs, queue and waste, now."""
    latest = _latest(ctx)
    loop = observe.loop_figures(ctx.db, ctx.now)
    with ctx.db.read() as s:
        out = observe.summary(s, latest, loop, ctx.srv.settings.currency)
    return {"at": ctx.now, **out}


@router.get("/admin/nodes/{node}/events")
@in_thread
def node_events(node: str, ctx: Admin, limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> list[NodeEventOut]:
    """Health rules that fired on the node and what was done about them, oldest first."""
    with ctx.db.read() as s:
        n = inventory.node(s, node)
        return [NodeEventOut.model_validate(e) for e in health.events(s, n.id, limit)]


@router.post("/admin/nodes/{node}/faults", status_code=201)
@in_thread
def inject_fault(node: str, body: FaultIn, ctx: Admin) -> dict[str, Any]:
    """Inject a fault into a virtual node's simulated GPU; it shows in the next samples. Repair: set it ready."""
    with ctx.db.write() as s, s.begin():
        row = health.inject(s, node, body.gpu, body.kind, body.xid, ctx.now)
        return {"id": row.id, "node": node, "gpu": row.gpu, "kind": row.kind, "xid": row.xid}


metrics_router = APIRouter(route_class=StrictJSONRoute, tags=["telemetry"])


@metrics_router.get("/metrics", response_class=Response)
@in_thread
def metrics(srv: Srv, ctx: Admin) -> Response:
    """Prometheus exposition: DCGM-exporter names per GPU, plus the platform's queue, capacity, waste and revenue.
    Scrape with an operator token (`authorization: {credentials: …}` in the scrape config)."""
    latest = _latest(ctx)
    loop = observe.loop_figures(ctx.db, ctx.now)
    with ctx.db.read() as s:
        series, platform = observe.exposition_inputs(s, latest, loop, srv.settings.currency)
    return Response(exposition.render(series, platform), media_type=exposition.CONTENT_TYPE)
