"""Organisations and their money: balance, transactions, statements, usage (members: `members.py`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from suanli.api.deps import Auth, in_thread
from suanli.api.schemas import (
    BalanceOut,
    OrgIn,
    OrgOut,
    StatementOut,
    StatementRowOut,
    TransactionOut,
    UtcTime,
    money,
)
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.money import shown
from suanli.control.accounts import accounts
from suanli.control.errors import NotFound
from suanli.control.money import ledger, statement, usage_statement

router = APIRouter(route_class=StrictJSONRoute, tags=["organisations"])


@router.get("/orgs")
@in_thread
def list_orgs(ctx: Auth) -> list[OrgOut]:
    with ctx.db.read() as s:
        return [OrgOut.model_validate(o).model_copy(update={"role": r}) for o, r in accounts.orgs_of(s, ctx.who)]


@router.post("/orgs", status_code=201)
@in_thread
def create_org(body: OrgIn, ctx: Auth) -> OrgOut:
    """A team organisation, owned by the caller, to share a balance with other users."""
    with ctx.db.write() as s, s.begin():
        org = accounts.create_org(s, ctx.who, body.name, ctx.now, ctx.srv.settings.teams_per_user)
    return OrgOut.model_validate(org).model_copy(update={"role": "owner"})


@router.get("/orgs/{org_id}")
@in_thread
def get_org(org_id: str, ctx: Auth) -> OrgOut:
    with ctx.db.read() as s:
        org = accounts.org_for(s, ctx.who, org_id)
        return OrgOut.model_validate(org).model_copy(update={"role": accounts.role_in(s, ctx.who, org_id)})


@router.get("/orgs/{org_id}/balance")
async def balance(org_id: str, ctx: Auth) -> BalanceOut:
    view = ledger.balance_view_of(await ctx.db.read_one(*ledger.balance_view_query(org_id, ctx.who.user_id)))
    if not view.member and not (ctx.who.is_admin and view.org_exists):
        raise NotFound(f"organisation {org_id} not found")
    book = ctx.srv.prices.cached(view.price_version)
    if book is None:
        book = await ctx.db.short_read(lambda c: ctx.srv.prices.book(c, view.price_version))
    bal = view.balance
    return BalanceOut(org_id=org_id, balance=shown(bal), exact=money(bal), currency=book.currency,
                      held_per_hour=shown(view.held_per_hour))  # fmt: skip


@router.get("/orgs/{org_id}/transactions")
@in_thread
def transactions(
    org_id: str,
    ctx: Auth,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
) -> list[TransactionOut]:
    """Ledger transactions that moved this org's money, newest first (page with `before_id`)."""
    with ctx.db.read() as s:
        accounts.org_for(s, ctx.who, org_id)
        rows = ledger.transactions(s, org_id, limit, before_id)
        return [
            TransactionOut(
                id=t.id, key=t.key, kind=t.kind, memo=t.memo, allocation_id=t.allocation_id, created_at=t.created_at,
                amount=money(ledger.net_for_org(t, org_id)),
            )
            for t in rows
        ]  # fmt: skip


USAGE_FORMATS = {
    200: {
        "description": "one row per allocation: JSON objects, or CSV with `format=csv`",
        "content": {"application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
                    "text/csv": {"schema": {"type": "string"}}},
    }
}  # fmt: skip


@router.get("/orgs/{org_id}/usage", response_model=None, responses=USAGE_FORMATS)
@in_thread
def usage(
    org_id: str,
    ctx: Auth,
    user_id: Annotated[str | None, Query(max_length=64)] = None,
    workload: Annotated[str | None, Query(max_length=128)] = None,
    since: Annotated[UtcTime | None, Query(description="times without a zone are UTC")] = None,
    until: Annotated[UtcTime | None, Query(description="times without a zone are UTC")] = None,
    after: Annotated[
        str | None, Query(max_length=64, description="the previous page's `X-Next-After` header: the next page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=usage_statement.USAGE_MAX_PAGE)] = usage_statement.USAGE_PAGE,
    format: Annotated[Literal["json", "csv"], Query()] = "json",
) -> Response | list[dict[str, object]]:
    """Usage statement: one row per allocation (workload, user, GPUs, seconds charged, cost), newest first, `limit`
    rows a page; the `X-Next-After` header names the next page's `after` (absent on the last page)."""
    with ctx.db.read() as s:
        accounts.org_for(s, ctx.who, org_id)
        rows, nxt = usage_statement.statement(s, org_id, user_id=user_id, workload=workload, since=since, until=until,
                                       after=after, limit=limit)  # fmt: skip
    headers = {"X-Next-After": nxt} if nxt is not None else {}
    if format == "csv":
        return PlainTextResponse(usage_statement.statement_csv(rows), media_type="text/csv", headers=headers)
    return JSONResponse(rows, headers=headers)


STATEMENT_CSV = {
    200: {
        "description": "a page of the statement; with `format=csv`, CSV (the next page's `after_id` in the "
                       "`X-Next-After-Id` header, absent on the last page)",
        "content": {"text/csv": {"schema": {"type": "string"}}},
    }
}  # fmt: skip


@router.get("/orgs/{org_id}/statement", response_model=StatementOut, responses=STATEMENT_CSV)
@in_thread
def org_statement(
    org_id: str,
    ctx: Auth,
    since: Annotated[
        UtcTime | None, Query(description="from the first transaction at or after it (UTC if no zone)")
    ] = None,
    until: Annotated[UtcTime | None, Query(description="up to the last transaction before it (UTC if no zone)")] = None,
    kind: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=32,
            pattern="^[a-z][a-z0-9_]{0,31}$",
            description="only rows of this kind (topup, usage, …); "
            "the balance after each stays the org's own, and a page may hold fewer rows than `limit`",
        ),
    ] = None,
    after_id: Annotated[int | None, Query(ge=0, le=2**62, description="the previous page's next_after_id")] = None,
    limit: Annotated[int, Query(ge=1, le=statement.MAX_PAGE)] = 500,
    format: Annotated[Literal["json", "csv"], Query()] = "json",
) -> Response | StatementOut:
    """Every transaction that moved this org's money, oldest first: top-ups, trial credit, usage per workload,
    plan purchases, refunds and credits, each with its memo and the balance after it. Members and operators only."""
    with ctx.db.read() as s:
        accounts.org_for(s, ctx.who, org_id)
        p = statement.page(s, org_id, since=since, until=until, kind=kind, after_id=after_id, limit=limit)
    if format == "csv":
        headers = {"X-Next-After-Id": str(p.next_after_id)} if p.next_after_id is not None else {}
        return PlainTextResponse(statement.to_csv(p.rows), media_type="text/csv", headers=headers)
    return StatementOut(org_id=p.org_id, currency=p.currency, opening_balance=money(p.opening_balance),
                        closing_balance=money(p.closing_balance), rows=[StatementRowOut(**r) for r in p.rows],
                        next_after_id=p.next_after_id)  # fmt: skip
