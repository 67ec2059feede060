"""Endpoints (`suanli deploy`, `suanli endpoints …`) and their API keys (`suanli keys create --endpoint`)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import ConfigDict, Field, StrictInt, field_validator, model_validator
from sqlalchemy.orm import Session

from suanli.api import reauth
from suanli.api.deps import Auth, Caller, in_thread
from suanli.api.schemas import In, Out, money
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.accounts import accounts
from suanli.control.serving import endpoints
from suanli.control.workloads.sandboxes import sandbox_policy
from suanli.db.serving import Endpoint, EndpointKey
from suanli.serving.spec import MAX_REPLICAS

router = APIRouter(route_class=StrictJSONRoute, tags=["endpoints"])
MAX_SPEC_CHARS = 64 * 1024


class EndpointIn(In):
    model_config = ConfigDict(extra="forbid", str_max_length=MAX_SPEC_CHARS)
    spec: dict[str, Any] | None = Field(None, description="the endpoint spec (kind: service) as JSON")
    spec_yaml: str | None = Field(None, max_length=MAX_SPEC_CHARS, description="…or as YAML text")
    org: str | None = Field(None, max_length=64, description="the org that owns and pays; default: your personal org")

    @model_validator(mode="after")
    def _one_spec(self) -> EndpointIn:
        if (self.spec is None) == (self.spec_yaml is None):
            raise ValueError("give exactly one of spec (JSON) or spec_yaml (YAML text)")
        return self


class ScaleIn(In):
    replicas: StrictInt = Field(ge=0, le=MAX_REPLICAS)


class KeyIn(In):
    name: str = Field("default", min_length=1, max_length=128)
    org: str | None = Field(None, max_length=64, description="the org that pays for what the key uses")
    # The caller's password: a key never expires, so a caller whose token does gives it (`api.reauth`).
    password: str | None = Field(None, min_length=1, max_length=1024)


class ReplicaOut(Out):
    workload_id: str
    name: str
    state: str
    ready: bool
    port: int
    attempt: int
    ready_at: datetime | None


class EventOut(Out):
    at: datetime
    kind: str
    reason: str


class EndpointOut(Out):
    id: str
    name: str
    org_id: str
    model: str
    repo_id: str
    runtime: str
    gpu: str | None
    gpus: int
    min_replicas: int
    max_replicas: int
    desired: int
    ready: int
    created_at: datetime
    price_per_1m_tokens: str | None = None
    replicas: list[ReplicaOut] = Field(default_factory=list)
    events: list[EventOut] = Field(default_factory=list)


class KeyOut(Out):
    id: str
    endpoint_id: str
    org_id: str
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    key: str | None = Field(None, description="the key itself: shown once, when it is created")


def _out(s: Session, e: Endpoint, detail: bool = False) -> EndpointOut:
    spec = endpoints.spec_of(e)
    reps = endpoints.replicas(s, e.id)
    gpu = spec.resources.gpu
    out = EndpointOut(
        id=e.id, name=e.name, org_id=e.org_id, model=spec.model, repo_id=e.repo_id, runtime=spec.runtime_name(),
        gpu=gpu if isinstance(gpu, str) else ",".join(gpu), gpus=spec.gpus(), min_replicas=e.min_replicas,
        max_replicas=e.max_replicas, desired=e.desired, ready=sum(endpoints.is_ready(r, w) for r, w in reps),
        created_at=e.created_at, price_per_1m_tokens=spec.price_per_1m_tokens,
    )  # fmt: skip
    if detail:
        out.replicas = [ReplicaOut(workload_id=w.id, name=w.name, state=w.state, ready=endpoints.is_ready(r, w),
                                   port=r.port, attempt=w.attempt, ready_at=r.ready_at)
                        for r, w in reps if w.state in ("pending", "scheduled", "starting", "running")]  # fmt: skip
        out.events = [EventOut.model_validate(x) for x in endpoints.events(s, e.id)]
    return out


def _admitting(ctx: Auth) -> endpoints.Admitting:
    srv = ctx.srv
    return endpoints.Admitting(srv.settings.admission_hold_minutes, srv.fleet, srv.prices,
                               sandbox_policy(srv.settings).check_image, srv.settings.volumes_root,
                               srv.settings.endpoints_per_org)  # fmt: skip


@router.post("/endpoints", status_code=201)
@in_thread
def deploy(body: EndpointIn, ctx: Auth) -> EndpointOut:
    """Deploy a hub model as an OpenAI-compatible endpoint; its replicas are workloads the serving loop submits."""
    spec = endpoints.parse(body.spec if body.spec is not None else body.spec_yaml or "")
    with ctx.db.write() as s, s.begin():
        e = endpoints.create(s, ctx.who, spec, ctx.now, _admitting(ctx), body.org)
        s.flush()
        return _out(s, e, detail=True)


@router.get("/endpoints")
@in_thread
def list_endpoints(ctx: Auth) -> list[EndpointOut]:
    with ctx.db.read() as s:
        return [_out(s, e) for e in endpoints.listing(s, ctx.who)]


@router.get("/endpoints/{ref}")
@in_thread
def describe(ref: str, ctx: Auth) -> EndpointOut:
    with ctx.db.read() as s:
        return _out(s, endpoints.get(s, ctx.who, ref), detail=True)


@router.post("/endpoints/{ref}/scale")
@in_thread
def scale(ref: str, body: ScaleIn, ctx: Auth) -> EndpointOut:
    """A fixed replica count (min = max); 0 scales to zero, and a request then starts one (a cold start)."""
    with ctx.db.write() as s, s.begin():
        e = endpoints.scale(s, ctx.who, ref, body.replicas, ctx.now)
        s.flush()
        return _out(s, e, detail=True)


@router.delete("/endpoints/{ref}")
@in_thread
def remove(ref: str, ctx: Auth) -> EndpointOut:
    """Stop every replica, delete the endpoint and its keys."""
    with ctx.db.write() as s, s.begin():
        e = endpoints.get(s, ctx.who, ref)
        out = _out(s, e)
        endpoints.remove(s, ctx.who, ref, ctx.now)
        return out


@router.post("/endpoints/{ref}/keys", status_code=201)
async def create_key(ref: str, body: KeyIn, request: Request, ctx: Auth) -> KeyOut:
    """An API key for the endpoint (shown once; only its SHA-256 is kept). Another org's endpoint with a price, by
    id: the key's org (`org`, default your personal one) pays the owner per 1M tokens. A key never expires: a
    caller whose token does gives the account's `password` (403 without it, 422 wrong, both naming it)."""
    proof = await reauth.gate(
        ctx, request, body.password, "an endpoint key", needed=ctx.who.token_expires_at is not None
    )
    return await run_in_threadpool(_create_key, ctx, ref, body, proof)


def _create_key(ctx: Caller, ref: str, body: KeyIn, proof: reauth.Proof | None) -> KeyOut:
    with ctx.db.write() as s, s.begin():
        accounts.check_live(s, ctx.who)
        reauth.settle(s, ctx, proof, ctx.now)
        row, secret = endpoints.create_key(s, ctx.who, ref, body.name, ctx.now, body.org)
        s.flush()
        return KeyOut.model_validate(row).model_copy(update={"key": secret})


@router.get("/endpoints/{ref}/keys")
@in_thread
def list_keys(ref: str, ctx: Auth) -> list[KeyOut]:
    with ctx.db.read() as s:
        return [KeyOut.model_validate(k) for k in endpoints.keys(s, ctx.who, ref)]


class UsageOut(Out):
    minute: datetime
    key_id: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    charged_tokens: int = Field(description="of these, tokens already charged to another org's key")
    charged: str = Field(description="what they cost at the endpoint's per-token price now (exact)")

    @field_validator("charged", mode="before")
    @classmethod
    def _exact(cls, v: object) -> object:
        return money(v) if isinstance(v, Decimal) else v


@router.get("/endpoints/{ref}/usage")
@in_thread
def usage(ref: str, ctx: Auth) -> list[UsageOut]:
    """Requests and tokens per key per minute (from the runtime's `usage`), newest first, the last 10,000 rows, with
    what other orgs' keys were charged for each."""
    with ctx.db.read() as s:
        return [UsageOut.model_validate(u) for u in endpoints.usage(s, ctx.who, ref)]


@router.delete("/endpoint-keys/{key_id}")
@in_thread
def revoke_key(key_id: str, ctx: Auth) -> KeyOut:
    """Revoke a key: the gateway refuses it within its cache's few seconds."""
    with ctx.db.write() as s, s.begin():
        row: EndpointKey = endpoints.revoke_key(s, ctx.who, key_id, ctx.now)
        return KeyOut.model_validate(row)
