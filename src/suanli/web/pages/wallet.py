"""The wallet: the balance, the full statement (filtered by kind and by days, paged, exported as CSV), the plans
bought, and redeeming a top-up code.

The API's statement pages forward from `since` by transaction id and carries each row's balance after it; the
kind and the last day are filtered here over those rows (each row keeps its own balance, so a filtered page is
still true). A page of the console reads at most `SCAN_PAGES` pages of the API; past that it offers the next."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from suanli.control.money import statement
from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.pages.account_forms import BadQuery, Tenant, day, number, word
from suanli.web.render import money
from suanli.web.session import Page

router = APIRouter()
PAGE_ROWS = 50  # rows a console page shows
API_PAGE = 500  # rows asked of the API at a time
SCAN_PAGES = 10  # API pages one console page reads at most (5,000 transactions)
CSV_PAGE = statement.MAX_PAGE
KINDS = ("topup", "trial_credit", "usage", "plan_purchase", "refund", "credit", "adjustment")


def _until(d: date | None) -> datetime | None:
    """The end of the day `d` (UTC): rows posted before the next midnight."""
    return datetime.combine(d + timedelta(days=1), time(0), UTC) if d is not None else None


def _at(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _filters(page: Page, q: dict[str, str]) -> dict[str, Any]:
    since, until = day(page, "since", q.get("since")), day(page, "until", q.get("until"))
    if since and until and until < since:
        raise BadQuery("until", page.t("on or after the first day", "不能早于开始日期"))
    return {"kind": word(page, "kind", q.get("kind")), "since": since, "until": until,
            "after": number(page, "after", q.get("after"))}  # fmt: skip


async def _statement(page: Page, org: str, f: dict[str, Any]) -> dict[str, Any]:
    """One console page of the statement: up to PAGE_ROWS rows of the kind, within the days."""
    rows: list[dict[str, Any]] = []
    cursor, end, scanned, opening, more = f["after"], _until(f["until"]), 0, None, False
    since = f["since"].isoformat() if f["since"] else None
    for _ in range(SCAN_PAGES):
        p = await page.get(f"/orgs/{org}/statement", since=since, after_id=cursor, limit=API_PAGE)
        opening = p["opening_balance"] if opening is None else opening
        more = p["next_after_id"] is not None
        for i, r in enumerate(p["rows"]):
            if end is not None and _at(r["created_at"]) >= end:  # posting order is time order: past the last day
                return {"rows": rows, "opening": opening, "next": None, "scanned": scanned}
            scanned, cursor = scanned + 1, r["id"]
            if f["kind"] is None or r["kind"] == f["kind"]:
                rows.append(r)
                if len(rows) == PAGE_ROWS:
                    left = more or i + 1 < len(p["rows"])
                    return {"rows": rows, "opening": opening, "next": cursor if left else None, "scanned": scanned}
        if not more:
            break
    return {"rows": rows, "opening": opening, "next": cursor if more else None, "scanned": scanned}


async def _view(page: Page, q: dict[str, str], status: int = 200, **extra: Any) -> Response:
    org = page.org["id"]
    balance = await page.get(f"/orgs/{org}/balance")
    plans = await page.get(f"/orgs/{org}/plans")
    ctx: dict[str, Any] = {"balance": balance, "plans": plans, "kinds": KINDS, "q": q, "fields": {}, "error": None,
                           "stmt": None, "redeemed": None}  # fmt: skip
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


def _filtered_csv(text: str, kind: str | None, end: datetime | None, header: bool) -> tuple[str, bool]:
    """The API's CSV page with only the rows of `kind` before `end`; True when it reached `end`. Text cells go
    through the statement's own formula guard again (already guarded, they pass unchanged)."""
    out, reached = [], False
    for r in csv.DictReader(io.StringIO(text)):
        if end is not None and _at(r["created_at"]) >= end:
            reached = True
            break
        if kind is None or r["kind"] == kind:
            out.append({k: (statement.cell(v) if k in statement.TEXT else v) for k, v in r.items()})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=statement.FIELDS, lineterminator="\n")
    if header:
        w.writeheader()
    w.writerows(out)
    return buf.getvalue(), reached


@router.get("/wallet/statement.csv")
async def statement_csv(request: Request, page: Tenant) -> Response:
    """The whole statement (or the filtered part) as the API's CSV, streamed page by page."""
    try:
        f = _filters(page, dict(request.query_params))
    except BadQuery as e:
        return Response(f"{e.field}: {e.message}\n", status_code=422, media_type="text/plain; charset=utf-8")
    org = page.org["id"]
    since, end = (f["since"].isoformat() if f["since"] else None), _until(f["until"])
    first = await page.api("GET", f"/orgs/{org}/statement",
                           params={k: v for k, v in {"since": since, "limit": CSV_PAGE, "format": "csv"}.items() if v})  # fmt: skip

    async def chunks() -> AsyncIterator[str]:
        r, header = first, True
        while True:
            if f["kind"] is None and end is None:
                text, reached = r.text if header else r.text.partition("\n")[2], False
            else:
                text, reached = _filtered_csv(r.text, f["kind"], end, header)
            yield text
            nxt = r.headers.get("X-Next-After-Id")
            if reached or not nxt:
                return
            params = {"limit": CSV_PAGE, "format": "csv", "after_id": nxt, **({"since": since} if since else {})}
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
