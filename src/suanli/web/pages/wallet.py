"""The wallet: the balance, the full statement (filtered by kind and by days, paged, exported as CSV), the plans
bought, redeeming a top-up code, and (where the trial credit waits for it) asking for a new e-mail verification link.

The API filters the statement (`since`, `until`, `kind`) and pages it by transaction id, each row with the org's
balance after it; a console page collects up to `PAGE_ROWS` rows from at most `SCAN_PAGES` of the API's pages and
past that offers the next."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.pages.account_forms import BadQuery, Tenant, day, number, word
from suanli.web.render import money
from suanli.web.session import Page

router = APIRouter()
PAGE_ROWS = 50  # rows a console page shows
API_PAGE = 500  # rows asked of the API at a time
SCAN_PAGES = 10  # API pages one console page reads at most (5,000 transactions)
CSV_PAGE = 1000  # the API's largest statement page
KINDS = ("topup", "trial_credit", "usage", "plan_purchase", "refund", "credit", "adjustment")


def _until(d: date | None) -> datetime | None:
    """The end of the day `d` (UTC): rows posted before the next midnight."""
    return datetime.combine(d + timedelta(days=1), time(0), UTC) if d is not None else None


def _filters(page: Page, q: dict[str, str]) -> dict[str, Any]:
    since, until = day(page, "since", q.get("since")), day(page, "until", q.get("until"))
    if since and until and until < since:
        raise BadQuery("until", page.t("on or after the first day", "不能早于开始日期"))
    return {"kind": word(page, "kind", q.get("kind")), "since": since, "until": until,
            "after": number(page, "after", q.get("after"))}  # fmt: skip


def _params(f: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The API's statement filters for the console's: whole UTC days, the last one included."""
    since, until = f["since"], _until(f["until"])
    params = {"since": since.isoformat() if since else None, "until": until.isoformat() if until else None,
              "kind": f["kind"], **more}  # fmt: skip
    return {k: v for k, v in params.items() if v is not None}


async def _statement(page: Page, org: str, f: dict[str, Any]) -> dict[str, Any]:
    """One console page of the statement: up to PAGE_ROWS rows of the kind, within the days."""
    rows: list[dict[str, Any]] = []
    cursor, opening = f["after"], None
    for _ in range(SCAN_PAGES):
        p = await page.get(f"/orgs/{org}/statement", **_params(f, after_id=cursor, limit=API_PAGE))
        opening = p["opening_balance"] if opening is None else opening
        for i, r in enumerate(p["rows"]):
            rows.append(r)
            if len(rows) == PAGE_ROWS:  # the next console page starts after this row, if anything follows it
                left = i + 1 < len(p["rows"]) or p["next_after_id"] is not None
                return {"rows": rows, "opening": opening, "next": r["id"] if left else None}
        cursor = p["next_after_id"]
        if cursor is None:
            return {"rows": rows, "opening": opening, "next": None}
    return {"rows": rows, "opening": opening, "next": cursor}


async def _view(page: Page, q: dict[str, str], status: int = 200, **extra: Any) -> Response:
    org = page.org["id"]
    balance = await page.get(f"/orgs/{org}/balance")
    plans = await page.get(f"/orgs/{org}/plans")
    ctx: dict[str, Any] = {"balance": balance, "plans": plans, "kinds": KINDS, "q": q, "fields": {}, "error": None,
                           "stmt": None, "redeemed": None, "verify_note": None,
                           "trial_pending": bool((page.me or {}).get("trial_pending"))}  # fmt: skip
    ctx.update(extra)
    try:
        f = _filters(page, q)
        ctx["stmt"] = await _statement(page, org, f)
    except BadQuery as e:
        ctx["fields"] = {**ctx["fields"], e.field: e.message}
        status = 422
    except ApiError as e:
        ctx["fields"], status = {**ctx["fields"], **e.fields()}, e.status
        ctx["error"] = ctx["error"] or e.detail
    ctx["csv_query"] = urlencode({k: q[k] for k in ("kind", "since", "until") if q.get(k)}) if ctx["stmt"] else ""
    return page.render("account/wallet.html", status=status, **ctx)


@router.get("/wallet")
async def wallet(request: Request, page: Tenant) -> Response:
    return await _view(page, dict(request.query_params))


@router.get("/wallet/statement.csv")
async def statement_csv(request: Request, page: Tenant) -> Response:
    """The whole statement (or the filtered part) as the API's CSV, streamed page by page."""
    try:
        f = _filters(page, dict(request.query_params))
    except BadQuery as e:
        return Response(f"{e.field}: {e.message}\n", status_code=422, media_type="text/plain; charset=utf-8")
    org = page.org["id"]
    first = await page.api("GET", f"/orgs/{org}/statement", params=_params(f, limit=CSV_PAGE, format="csv"))

    async def chunks() -> AsyncIterator[str]:
        r, header = first, True
        while True:
            yield r.text if header else r.text.partition("\n")[2]
            nxt = r.headers.get("X-Next-After-Id")
            if not nxt:
                return
            params = _params(f, limit=CSV_PAGE, format="csv", after_id=nxt)
            r, header = await page.api("GET", f"/orgs/{org}/statement", params=params), False

    name = f"statement-{org}.csv"
    headers = {"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store"}
    return StreamingResponse(chunks(), media_type="text/csv; charset=utf-8", headers=headers)


@router.post("/wallet/redeem")
async def redeem(request: Request, page: Tenant) -> Response:
    """Redeem a top-up code into the org the console acts for; the API's refusal (no such code, used, expired,
    another org's, a viewer, too many tries) is shown at the field."""
    data = await session.form(request, page)
    code = data.get("code", "").strip()
    try:
        r = (await page.api("POST", f"/orgs/{page.org['id']}/redeem", json={"code": code})).json()
    except ApiError as e:
        fields = e.fields() or {"code": e.detail}
        return await _view(page, {}, status=e.status, fields=fields)
    amount, now = money(r["amount"]), money(r["balance"])
    said = page.t(
        f"Redeemed: {amount} added; the balance is now {now}.", f"兑换成功：已充值 {amount}，当前余额 {now}。"
    )
    return await _view(page, {}, redeemed=said)


@router.post("/wallet/verify-resend")
async def resend_verification(request: Request, page: Tenant) -> Response:
    """Mail the user a new verification link (the trial credit waits for it); a refusal (verified already, asked
    too often) is shown in its place."""
    await session.form(request, page)
    try:
        sent_to = (await page.api("POST", "/verify/resend")).json()["sent_to"]
    except ApiError as e:
        return await _view(page, {}, status=e.status, verify_note=e.detail)
    note = page.t(f"A new link is on its way to {sent_to}.", f"新的验证链接已发送至 {sent_to}。")
    return await _view(page, {}, verify_note=note)
