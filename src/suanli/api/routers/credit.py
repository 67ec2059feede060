"""Self-service credit: operators' top-up code batches, tenants redeeming a code, and payment providers' webhooks.
The rules are in docs/payments.md."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import Field

from suanli.api.deps import Auth, Srv, client_address, in_thread
from suanli.api.routers.admin import Admin
from suanli.api.schemas import Amount, ErrorOut, In, Out, UtcTime, money
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.money import shown
from suanli.control.ids import utcnow
from suanli.control.money import payments, topup_codes

router = APIRouter(route_class=StrictJSONRoute, tags=["credit"])
CODES = "/admin/topup-codes"


class BatchIn(In):
    amount: Amount = Field(gt=0, le=topup_codes.MAX_AMOUNT, decimal_places=2, description="each code's worth")
    count: int = Field(ge=1, le=topup_codes.MAX_COUNT, description="how many codes")
    expires_at: UtcTime | None = Field(None, description="none: the codes never expire (UTC if no zone)")
    note: str = Field("", max_length=topup_codes.NOTE_CHARS, description="shown in each redemption's statement line")
    org: str | None = Field(None, max_length=254, description="only this org (id or name) may redeem the codes")


class BatchOut(Out):
    id: str
    amount: str
    count: int
    note: str
    org_id: str | None
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    redeemed: int
    voided: int


class NewCodeOut(Out):
    id: str
    code: str = Field(description="shown once; stored only as its SHA-256")


class NewBatchOut(Out):
    batch: BatchOut
    codes: list[NewCodeOut]


class CodeOut(Out):
    id: str
    batch_id: str
    hint: str = Field(description="the code's last 4 characters")
    state: str = Field(description="unused | redeemed | voided | expired")
    redeemed_at: datetime | None
    redeemed_by: str | None = Field(description="the redeeming user's email")
    redeemed_org: str | None
    transaction_id: int | None
    voided_at: datetime | None


class BatchDetailOut(BatchOut):
    codes: list[CodeOut]


class VoidIn(In):
    codes: list[str] | None = Field(None, max_length=topup_codes.MAX_COUNT, description="none: every unredeemed code")


class RedeemIn(In):
    code: str = Field(min_length=1, max_length=64)


class RedemptionOut(Out):
    code_id: str
    batch_id: str
    org_id: str
    amount: str
    transaction_id: int
    memo: str
    created_at: datetime
    balance: str = Field(description="the org's balance after it, two decimals")
    exact_balance: str


class PaymentOut(Out):
    provider: str
    event_id: str
    transaction_id: int
    duplicate: bool = Field(description="posted before: nothing was credited now")


def _batch(b: topup_codes.BatchView) -> BatchOut:
    return BatchOut(**{**b.__dict__, "amount": money(b.amount)})


@router.post(CODES, status_code=201)
@in_thread
def create_batch(body: BatchIn, ctx: Admin) -> NewBatchOut:
    """A batch of top-up codes; the codes are in this answer only (print them now)."""
    with ctx.db.write() as s, s.begin():
        b, made = topup_codes.create_batch(s, ctx.who, Decimal(body.amount), body.count, ctx.now,
                                           expires_at=body.expires_at, note=body.note, org=body.org)  # fmt: skip
    return NewBatchOut(batch=_batch(b), codes=[NewCodeOut(id=i, code=c) for i, c in made])


@router.get(CODES)
@in_thread
def list_batches(ctx: Admin, limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[BatchOut]:
    """Batches, newest first, with how many codes of each were redeemed and voided."""
    with ctx.db.read() as s:
        return [_batch(b) for b in topup_codes.batches(s, limit)]


@router.get(CODES + "/{batch_id}")
@in_thread
def get_batch(batch_id: str, ctx: Admin) -> BatchDetailOut:
    """A batch and its codes (hints, never the codes): which were redeemed, by whom, into which org, when."""
    with ctx.db.read() as s:
        b = topup_codes.batch(s, batch_id)
        rows = topup_codes.codes(s, batch_id, ctx.now)
    return BatchDetailOut(**_batch(b).model_dump(), codes=[CodeOut(**c.__dict__) for c in rows])


@router.post(CODES + "/{batch_id}/void")
@in_thread
def void_codes(batch_id: str, body: VoidIn, ctx: Admin) -> BatchOut:
    """Void the batch's unredeemed codes, or the ones named (409 if one of them was redeemed)."""
    with ctx.db.write() as s, s.begin():
        return _batch(topup_codes.void(s, batch_id, ctx.now, body.codes))


@router.post("/orgs/{org_id}/redeem", responses={410: {"model": ErrorOut, "description": "voided or expired"}})
async def redeem(org_id: str, body: RedeemIn, request: Request, ctx: Auth) -> RedemptionOut:
    """Redeem a top-up code into the org (owners, admins and members; 403 for a viewer). 404: no such code; 409:
    redeemed already; 410: voided or expired; 403: a code for another org; 429: too many codes tried."""
    r = await run_in_threadpool(topup_codes.redeem_with_throttle, ctx.db, ctx.who, org_id, body.code,
                                client_address(request), ctx.now)  # fmt: skip
    return RedemptionOut(code_id=r.code_id, batch_id=r.batch_id, org_id=r.org_id, amount=money(r.amount),
                         transaction_id=r.transaction_id, memo=r.memo, created_at=r.created_at,
                         balance=shown(r.balance), exact_balance=money(r.balance))  # fmt: skip


@router.post("/payments/{provider}/webhook")
async def payment_webhook(provider: str, request: Request, srv: Srv) -> PaymentOut:
    """A payment provider's signed notice of a payment: verified by the provider's adapter, posted once per event
    id. No login: the signature is the credential. 401: a bad, missing or stale signature."""
    body = await request.body()
    p = await run_in_threadpool(payments.receive, srv.db, srv.settings, provider, request.headers, body, utcnow())
    return PaymentOut(provider=p.provider, event_id=p.event_id, transaction_id=p.transaction_id, duplicate=p.duplicate)
