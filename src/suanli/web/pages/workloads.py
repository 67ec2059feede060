"""A tenant's workloads: the list (running, or everything with finished ones), and one workload's page with its
state, events, pending reason, where it runs, cost growing live, live logs, per-GPU charts and stop/start/scale.

Every read and write is the public API's (`/workloads`, `/workloads/{ref}`, `…/logs`, `…/metrics`, `…/stop`,
`…/start`, `…/scale`) with the session's token: another org's workload is the API's 404, shown as such.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.forms import as_int
from suanli.web.session import Page

router = APIRouter()
Tenant = Annotated[Page, Depends(session.tenant)]
ACTIVE = ("pending", "scheduled", "starting", "running")
LOG_CHUNK = 64 * 1024  # bytes of log one poll appends; the next poll reads on from where it stopped
MAX_REF = 128


def ref_path(ref: str) -> str:
    """The API path of one workload: the reference escaped whole, so `..` or a slash cannot reach another route."""
    return "/workloads/" + quote(ref[:MAX_REF], safe="")


def runtime_s(w: dict[str, Any], now: datetime) -> int | None:
    """Seconds it has run (started to finished, or to now while it runs)."""
    if not w.get("started_at"):
        return None
    start = datetime.fromisoformat(str(w["started_at"]).replace("Z", "+00:00"))
    end = datetime.fromisoformat(str(w["finished_at"]).replace("Z", "+00:00")) if w.get("finished_at") else now
    return max(int((end - start).total_seconds()), 0)


def _now() -> datetime:
    return datetime.now(UTC)


def _where(w: dict[str, Any]) -> list[str]:
    alloc = w.get("allocation") or {}
    return [f"{node}: GPU {', '.join(str(g) for g in gpus)}" for node, gpus in (alloc.get("nodes") or {}).items()]


async def _one(page: Page, ref: str) -> dict[str, Any] | Response:
    """The workload, or the page that says it is not there (the API's 404 for another org's work, too)."""
    try:
        w: dict[str, Any] = await page.get(ref_path(ref))
    except ApiError as e:
        if e.status in (403, 404, 422):
            return page.render("work/missing.html", status=404, message=e.detail)
        raise
    w["runtime_s"] = runtime_s(w, _now())
    w["where"] = _where(w)
    w["active"] = w["state"] in ACTIVE
    return w


@router.get("/workloads")
async def listing(page: Tenant, all: bool = False) -> Response:
    rows = await page.get("/workloads", org=page.org["id"] or None, all=all or None)
    now = _now()
    for w in rows:
        w["runtime_s"] = runtime_s(w, now)
    return page.render("work/workloads.html", rows=rows, all=all)


def _detail(page: Page, w: dict[str, Any], status: int = 200, **ctx: Any) -> Response:
    ctx.setdefault("scale_error", None)
    ctx.setdefault("error", None)
    ctx.setdefault("scale_value", w.get("scale_to") or w["gpus"])
    return page.render("work/workload.html", status=status, w=w, **ctx)


@router.get("/workloads/{ref}")
async def detail(page: Tenant, ref: str) -> Response:
    w = await _one(page, ref)
    return w if isinstance(w, Response) else _detail(page, w)


@router.get("/_/workloads/{ref}/status")
async def status_fragment(page: Tenant, ref: str) -> Response:
    """The live part of a workload's page (state, cost, rate, pending reason, where, events), polled by htmx."""
    w = await _one(page, ref)
    return w if isinstance(w, Response) else page.render("work/_status.html", w=w)


@router.get("/_/workloads/{ref}/events")
async def events_fragment(page: Tenant, ref: str) -> Response:
    """The workload's events, polled by htmx."""
    w = await _one(page, ref)
    return w if isinstance(w, Response) else page.render("work/_events.html", w=w)


@router.get("/_/workloads/{ref}/logs")
async def logs_fragment(page: Tenant, ref: str, offset: Annotated[int, Query(ge=0, le=1 << 50)] = 0) -> Response:
    """The log from `offset`, to append, followed by the poller that asks for the rest (none once it is done)."""
    try:
        chunk = await page.get(ref_path(ref) + "/logs", offset=offset, limit=LOG_CHUNK)
    except ApiError as e:
        if e.status in (403, 404):
            return page.render("work/missing.html", status=404, message=e.detail)
        raise
    return page.render("work/_logs.html", ref=ref, data=chunk["data"], next_offset=chunk["next_offset"],
                       done=chunk["done"], more=chunk["next_offset"] > offset)  # fmt: skip


@router.get("/_/workloads/{ref}/metrics")
async def metrics(page: Tenant, ref: str) -> Response:
    """The API's per-GPU series for the page's charts (its script cannot send the session's bearer token itself)."""
    try:
        body = await page.get(ref_path(ref) + "/metrics", resolution="raw")
    except ApiError as e:
        return JSONResponse({"detail": e.detail}, status_code=e.status if e.status < 500 else 502)
    series = [
        {"label": f"{g['node']}/{g['gpu']}",
         "points": [[p["t"], p.get("util"), p.get("temp_c"), p.get("mem_used_mib")] for p in g.get("points", [])]}
        for g in body.get("gpus", [])
    ]  # fmt: skip
    return JSONResponse({"gpus": series}, headers={"Cache-Control": "no-store"})


async def _act(request: Request, page: Page, ref: str, action: str) -> Response:
    await session.form(request, page)
    try:
        await page.api("POST", ref_path(ref) + "/" + action, json={})
    except ApiError as e:
        w = await _one(page, ref)
        return w if isinstance(w, Response) else _detail(page, w, status=e.status, error=e.detail)
    return RedirectResponse("/workloads/" + quote(ref, safe=""), status_code=303)


@router.post("/workloads/{ref}/stop")
async def stop(request: Request, page: Tenant, ref: str) -> Response:
    return await _act(request, page, ref, "stop")


@router.post("/workloads/{ref}/start")
async def start(request: Request, page: Tenant, ref: str) -> Response:
    return await _act(request, page, ref, "start")


@router.post("/workloads/{ref}/scale")
async def scale(request: Request, page: Tenant, ref: str) -> Response:
    """Resize to the GPU count typed in; a bad count is the API's message, shown next to the field."""
    data = await session.form(request, page)
    raw = data.get("gpus", "").strip()[:32]
    try:  # not a number: the API says what it must be
        await page.api("POST", ref_path(ref) + "/scale", json={"gpus": as_int(raw)})
    except ApiError as e:
        w = await _one(page, ref)
        if isinstance(w, Response):
            return w
        return _detail(page, w, status=e.status, scale_error=e.fields().get("gpus", e.detail), scale_value=raw)
    return RedirectResponse("/workloads/" + quote(ref, safe=""), status_code=303)
