"""Operator endpoints: users and invite codes, org quotas and money, clusters and nodes, prices, ledger checks."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import Field
from sqlalchemy.orm import Session

from suanli.api.deps import Auth, Caller, caller, in_thread
from suanli.api.schemas import (
    AdminUserIn,
    AdminUserPatch,
    CheckOut,
    In,
    MoveIn,
    OrgOut,
    Out,
    QuotaIn,
    TransactionOut,
    UserOut,
    money,
)
from suanli.api.schemas_market import (
    ClusterIn,
    ClusterOut,
    GpuOut,
    NodeDetailOut,
    NodeOut,
    NodeStateIn,
    PlanPriceIn,
    PriceBookIn,
    PriceGpuIn,
    PriceHostIn,
    PriceUsageIn,
)
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.money import ZERO
from suanli.control import leases
from suanli.control.accounts import accounts, signups
from suanli.control.background import WorkloadLoop, this_server
from suanli.control.errors import Invalid
from suanli.control.ids import new_id
from suanli.control.money import ledger, prices
from suanli.control.scheduling import inventory
from suanli.control.telemetry import health
from suanli.control.workloads import workloads
from suanli.db.models import ClusterRow
from suanli.telemetry import nvml


async def admin(ctx: Auth) -> Caller:
    accounts.require_admin(ctx.who)
    return ctx


Admin = Annotated[Caller, Depends(admin)]
router = APIRouter(route_class=StrictJSONRoute, prefix="/admin", tags=["admin"], dependencies=[Depends(caller)])


# ---- users and orgs -----------------------------------------------------------------------------------------
@router.get("/users")
@in_thread
def list_users(ctx: Admin, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> list[UserOut]:
    with ctx.db.read() as s:
        return [UserOut.model_validate(u) for u in accounts.users(s, limit)]


@router.post("/users", status_code=201)
async def create_user(body: AdminUserIn, ctx: Admin) -> UserOut:
    """A user with a personal org. The password is hashed first, on the password threads (`control.accounts.passwords`),
    not on a request thread inside the write transaction (on SQLite every other write waited for the hash)."""
    accounts.check_credentials(body.email, body.password)  # 422 before anything is hashed
    hashed = await ctx.srv.passwords.run(accounts.hash_password, body.password)
    return await run_in_threadpool(_create_user, ctx, body, hashed)


def _create_user(ctx: Caller, body: AdminUserIn, hashed: str) -> UserOut:
    credit = ctx.srv.settings.trial_credit if body.trial_credit else ZERO
    with ctx.db.write() as s, s.begin():
        u, _ = accounts.create_user(s, body.email, body.password, ctx.now, admin=body.admin, trial_credit=credit,
                                    password_hash=hashed)  # fmt: skip
    return UserOut.model_validate(u)


@router.patch("/users/{user_id}")
@in_thread
def patch_user(user_id: str, body: AdminUserPatch, ctx: Admin) -> UserOut:
    with ctx.db.write() as s, s.begin():
        out = UserOut.model_validate(accounts.set_admin(s, user_id, body.admin))
    ctx.srv.tokens.forget_all()
    return out


class InviteCodeIn(In):
    uses: int = Field(1, ge=1, le=signups.MAX_USES, description="how many people may sign up with it")
    expires_in_days: int = Field(7, ge=1, le=signups.MAX_DAYS)
    note: str = Field("", max_length=200, description="who it is for, to recognise it by")


class InviteCodeOut(Out):
    id: str
    prefix: str
    note: str
    uses_left: int
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None


class NewInviteCodeOut(InviteCodeOut):
    code: str = Field(description="shown once; signs people up where signup is invite-only")


@router.post("/invites", status_code=201)
@in_thread
def create_invite_code(body: InviteCodeIn, ctx: Admin) -> NewInviteCodeOut:
    """An invite code for signup where it is invite-only (`signup: invite`)."""
    with ctx.db.write() as s, s.begin():
        row, code = signups.create_code(s, ctx.who, body.uses, body.expires_in_days, body.note, ctx.now)
        return NewInviteCodeOut(**InviteCodeOut.model_validate(row).model_dump(), code=code)


@router.get("/invites")
@in_thread
def list_invite_codes(ctx: Admin) -> list[InviteCodeOut]:
    with ctx.db.read() as s:
        return [InviteCodeOut.model_validate(r) for r in signups.codes(s)]


@router.delete("/invites/{code_id}")
@in_thread
def revoke_invite_code(code_id: str, ctx: Admin) -> InviteCodeOut:
    with ctx.db.write() as s, s.begin():
        return InviteCodeOut.model_validate(signups.revoke_code(s, code_id, ctx.now))


@router.get("/orgs")
@in_thread
def list_orgs(ctx: Admin, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> list[OrgOut]:
    with ctx.db.read() as s:
        return [OrgOut.model_validate(o) for o in accounts.all_orgs(s, limit)]


@router.put("/orgs/{org}/quota")
@in_thread
def set_quota(org: str, body: QuotaIn, ctx: Admin) -> OrgOut:
    """`org` is an id or a name (a personal org is named after its user's email). Only the quotas the body names
    change (GPUs, host CPU cores, host memory GiB); null lifts that limit."""
    with ctx.db.write() as s, s.begin():
        return OrgOut.model_validate(accounts.set_quota(s, org, body.limits()))


@router.post("/orgs/{org}/transactions", status_code=201)
@in_thread
def move_money(org: str, body: MoveIn, ctx: Admin) -> TransactionOut:
    """Top up (cash in), credit (goodwill) or refund; with `key`, a retried request posts nothing twice."""
    with ctx.db.write() as s, s.begin():
        row = accounts.org_by_ref(s, org)
        key = f"{body.kind}:{row.id}:{body.key or new_id('op')}"
        t, _ = ledger.move(s, body.kind, row.id, body.amount, key, ctx.now, body.memo, ctx.who.user_id)
        return TransactionOut(id=t.id, key=t.key, kind=t.kind, memo=t.memo, amount=money(ledger.net_for_org(t, row.id)),
                              allocation_id=None, created_at=t.created_at)  # fmt: skip


@router.get("/ledger/check")
@in_thread
def check_ledger(ctx: Admin) -> CheckOut:
    """Recompute every balance from its entries and check every transaction sums to zero."""
    with ctx.db.read() as s:
        bad = ledger.recompute(s)
    return CheckOut(ok=not bad, mismatches={k: [money(a), money(b)] for k, (a, b) in bad.items()})


# ---- prices -------------------------------------------------------------------------------------------------
@router.put("/prices")
@in_thread
def put_prices(
    body: PriceBookIn,
    ctx: Admin,
    if_match: Annotated[str | None, Header(alias="If-Match", max_length=64)] = None,
) -> dict[str, object]:
    """Replace the whole price book (same document as GET /prices; its `version` is ignored). With `If-Match` set
    to the `ETag` of the book it was read from, only while that is still the one in force (else 412: another edit
    was made since); without it, whatever is in force."""
    replaces = _version_matched(if_match)
    book = prices.validate(body.model_dump(mode="json", exclude={"version"}))
    with ctx.db.write() as s, s.begin():
        version = prices.replace_book(s, book, ctx.now, ctx.who.user_id, replaces)
    return {"version": version, **book.model_dump(mode="json")}


ETAG_RE = re.compile(r'"([0-9]{1,18})"')  # ASCII digits only: str.isdigit also takes '²', which int() refuses


def _version_matched(if_match: str | None) -> int | None:
    """`If-Match`: `"N"` (a version, as `GET /prices` sends its ETag) or `*` (any); None when absent or `*`."""
    if if_match is None or if_match.strip() == "*":
        return None
    m = ETAG_RE.fullmatch(if_match.strip())
    if m is None:
        raise Invalid('If-Match: the ETag of GET /prices (a version in quotes, e.g. "12") or *')
    return int(m.group(1))


PlanName = Annotated[
    str, Path(min_length=1, max_length=32, description="as in the book: 1-32 characters (月付, weekly)")
]


@router.put("/prices/plans/{name}")
@in_thread
def put_plan(name: PlanName, body: PlanPriceIn, ctx: Admin) -> dict[str, object]:
    """Add or change one plan (its hours and discount) as a new version of the book. Plans bought keep their
    terms."""
    with ctx.db.write() as s, s.begin():
        version, book = prices.set_plan(s, name, body.hours, body.discount, ctx.now, ctx.who.user_id)
    return {"version": version, **book.model_dump(mode="json")}


@router.delete("/prices/plans/{name}")
@in_thread
def retire_plan(name: PlanName, ctx: Admin) -> dict[str, object]:
    """Retire a plan: no longer sold, as a new version of the book (404 if the book has none of that name). Plans
    bought keep their terms."""
    with ctx.db.write() as s, s.begin():
        version, book = prices.retire_plan(s, name, ctx.now, ctx.who.user_id)
    return {"version": version, **book.model_dump(mode="json")}


@router.put("/prices/host")
@in_thread
def put_host_prices(body: PriceHostIn, ctx: Admin) -> dict[str, object]:
    """Change the host prices (per CPU core-hour, per GiB-hour of memory) as a new version of the book."""
    with ctx.db.write() as s, s.begin():
        version, book = prices.set_host_prices(s, body.cpu_core_hour, body.memory_gib_hour, ctx.now, ctx.who.user_id)
    return {"version": version, **book.model_dump(mode="json")}


@router.put("/prices/usage")
@in_thread
def put_usage_prices(body: PriceUsageIn, ctx: Admin) -> dict[str, object]:
    """Change usage prices (per GPU-hour fully active; null stops offering a model by usage) and/or the floor (the
    share of it an idle GPU-hour costs) as a new version of the book. Running work keeps the prices it started at."""
    with ctx.db.write() as s, s.begin():
        version, book = prices.set_usage_prices(s, body.gpu_hour, body.floor, ctx.now, ctx.who.user_id)
    return {"version": version, **book.model_dump(mode="json")}


@router.put("/prices/gpus/{gpu}")
@in_thread
def put_gpu_price(gpu: str, body: PriceGpuIn, ctx: Admin) -> dict[str, object]:
    with ctx.db.write() as s, s.begin():
        version, book = prices.set_gpu_price(s, gpu, body.on_demand, ctx.now, ctx.who.user_id, remove=body.remove)
    return {"version": version, **book.model_dump(mode="json")}


# ---- clusters and nodes -------------------------------------------------------------------------------------
def _cluster_out(s: Session, row: ClusterRow) -> ClusterOut:
    n, g = inventory.cluster_size(s, row.id)
    return ClusterOut(id=row.id, name=row.name, source=row.source, nodes=n, gpus=g, created_at=row.created_at)


@router.get("/clusters")
@in_thread
def list_clusters(ctx: Admin) -> list[ClusterOut]:
    with ctx.db.read() as s:
        return [_cluster_out(s, c) for c in inventory.clusters(s)]


@router.post("/clusters", status_code=201)
@in_thread
def register_cluster(body: ClusterIn, ctx: Admin) -> ClusterOut:
    """Register nodes: a topology preset or a cluster spec (virtual nodes), or this host (`local`, via NVML)."""
    host = nvml.discover() if body.local else None  # hardware is read before the transaction opens
    with ctx.db.write() as s, s.begin():
        if host is not None:
            row = inventory.register_host(s, host, ctx.now, body.name)
        elif body.preset is not None:
            row = inventory.register_preset(s, body.preset, ctx.now, body.name)
        else:
            row = inventory.register_spec(s, dict(body.spec or {}), ctx.now, name=body.name)
        return _cluster_out(s, row)


@router.delete("/clusters/{cluster}", status_code=204)
@in_thread
def remove_cluster(cluster: str, ctx: Admin) -> None:
    with ctx.db.write() as s, s.begin():
        inventory.remove_cluster(s, cluster)


@router.get("/nodes")
@in_thread
def list_nodes(
    ctx: Admin,
    state: Annotated[str | None, Query(pattern="^(ready|draining|down)$")] = None,
    cluster: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=20_000)] = 1000,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> list[NodeOut]:
    with ctx.db.read() as s:
        rows = inventory.nodes(s, state=state, cluster=cluster, limit=limit, offset=offset)
        bad = inventory.unhealthy_gpus(s, [n.id for n in rows])
        return [NodeOut.model_validate(n).model_copy(update={"unhealthy_gpus": bad.get(n.id, 0)}) for n in rows]


@router.get("/nodes/{node}")
@in_thread
def get_node(node: str, ctx: Admin) -> NodeDetailOut:
    with ctx.db.read() as s:
        n = inventory.node(s, node)
        gpus = [GpuOut.model_validate(g) for g in inventory.gpus_of(s, n.id)]
        out = NodeOut.model_validate(n).model_copy(update={"unhealthy_gpus": sum(not g.healthy for g in gpus)})
        return NodeDetailOut(**out.model_dump(), gpus=gpus)


@router.patch("/nodes/{node}")
@in_thread
def set_node_state(node: str, body: NodeStateIn, ctx: Admin) -> NodeOut:
    """Drain a node (running work finishes, nothing new lands), take it down, or bring it back."""
    with ctx.db.write() as s, s.begin():
        return NodeOut.model_validate(health.set_state(s, node, body.state, body.reason, ctx.now))


# ---- workloads ----------------------------------------------------------------------------------------------
class LoopOut(Out):
    leader: str | None = Field(description="the process running the scheduling loop now (host:server-pid/pid:id)")
    this_process: bool = Field(description="whether the leader is the answering server's background process")
    passes: int = 0
    queued: int | None = Field(None, description="pending workloads the last pass saw")
    placed: int | None = None
    refused: int | None = None
    cycle_ms: float | None = Field(None, description="the scheduler cycles of the last pass")
    pass_ms: float | None = Field(None, description="the whole last scheduling pass: snapshot, cycles, persisting")


class WorkloadSummaryOut(Out):
    states: dict[str, int]
    loop: LoopOut


@router.get("/workloads/summary")
@in_thread
def workload_summary(ctx: Admin) -> WorkloadSummaryOut:
    """Workloads of all orgs by state, and the scheduling loop's leader and its last pass."""
    with ctx.db.read() as s:
        states = workloads.state_counts(s)
    leader, info = leases.holder(ctx.db, WorkloadLoop.LEASE, ctx.now)
    known = {k: v for k, v in info.items() if k in LoopOut.model_fields}
    return WorkloadSummaryOut(states=states, loop=LoopOut(leader=leader, this_process=this_server(leader), **known))
