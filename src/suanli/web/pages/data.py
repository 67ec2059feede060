"""Volumes (list with size, use and what they cost; create; a volume's files, versions, snapshot, restore, clone)
and the hub (models and datasets with size, licence, revision and the line that names each in a spec)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.pages.account_forms import Tenant, at_fields, done, integer_or_text, missing, seg
from suanli.web.session import Page

router = APIRouter()
LS_LIMIT = 500  # entries of a directory shown at once (the API pages by name)
UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human(n: Any) -> str:
    """Bytes as a person reads them (binary units, one decimal)."""
    try:
        v = Decimal(int(n))
    except (TypeError, ValueError):
        return "—"
    for unit in UNITS:
        if abs(v) < 1024 or unit == UNITS[-1]:
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(n)  # pragma: no cover


def _crumbs(path: str) -> list[tuple[str, str]]:
    """(name, path) for each folder above and at `path`, for links back up."""
    parts = [p for p in path.split("/") if p]
    return [(p, "/".join(parts[: i + 1])) for i, p in enumerate(parts)]


async def _list_view(page: Page, status: int = 200, **extra: Any) -> Response:
    vols = await page.get("/volumes", org=page.org["id"])
    ctx: dict[str, Any] = {"volumes": vols, "human": human, "error": None, "fields": {}, "form": {}}
    ctx.update(extra)
    return page.render("account/volumes.html", status=status, **ctx)


@router.get("/volumes")
async def volumes(page: Tenant) -> Response:
    return await _list_view(page)


@router.post("/volumes")
async def create_volume(request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    body = {
        "name": data.get("name", "").strip(),
        "size": integer_or_text(data.get("size")) or "",
        "org": page.org["id"],
    }
    try:
        made = (await page.api("POST", "/volumes", json=body)).json()
    except ApiError as e:
        return await _list_view(page, status=e.status, fields=at_fields(e, "name", ("name", "size")), form=data)
    return done(f"/volumes/{made['id']}")


async def _volume_view(page: Page, ref: str, path: str = "", status: int = 200, **extra: Any) -> Response:
    """A volume of the org the console acts for: another org's (or none) is the API's 404, shown as such."""
    org = page.org["id"]
    v = await page.get(f"/volumes/{seg(ref)}", org=org)
    entries: list[dict[str, Any]] = []
    ls_error = None
    try:
        q = {"path": path, "limit": LS_LIMIT}
        entries = (await page.api("GET", f"/volumes/{seg(v['id'])}/ls", params=q)).json()
    except ApiError as e:
        ls_error = e.detail
    ctx: dict[str, Any] = {"v": v, "versions": await page.get(f"/volumes/{seg(v['id'])}/versions"),
                           "entries": entries, "path": path, "crumbs": _crumbs(path), "ls_error": ls_error,
                           "ls_limit": LS_LIMIT, "human": human, "error": None, "fields": {}, "form": None,
                           "notice": None}  # fmt: skip
    ctx.update(extra)
    return page.render("account/volume.html", status=status, **ctx)


@router.get("/volumes/{ref}")
async def volume(ref: str, page: Tenant, path: str = "") -> Response:
    try:
        return await _volume_view(page, ref, path[:4096])
    except ApiError as e:
        return missing(page, e, "/volumes")


async def _act(page: Page, ref: str, what: str, method: str, api_path: str, body: dict[str, Any],
               known: tuple[str, ...], default: str) -> Response:  # fmt: skip
    try:
        r = (await page.api(method, api_path, json=body, params={"org": page.org["id"]})).json()
    except ApiError as e:
        try:
            return await _volume_view(page, ref, status=e.status, error=e.detail, form=what,
                                      fields=at_fields(e, default, known))  # fmt: skip
        except ApiError as gone:
            return missing(page, gone, "/volumes")
    return done(f"/volumes/{r['id']}" if what == "clone" else f"/volumes/{seg(ref)}")


@router.post("/volumes/{ref}/snapshot")
async def snapshot(ref: str, request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    body = {"message": data.get("message", "")}
    return await _act(page, ref, "snapshot", "POST", f"/volumes/{seg(ref)}/versions", body, ("message",), "message")


@router.post("/volumes/{ref}/restore")
async def restore(ref: str, request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    body = {"version": integer_or_text(data.get("version")) or ""}
    return await _act(page, ref, "restore", "POST", f"/volumes/{seg(ref)}/restore", body, ("version",), "version")


@router.post("/volumes/{ref}/clone")
async def clone(ref: str, request: Request, page: Tenant) -> Response:
    data = await session.form(request, page)
    body = {"version": integer_or_text(data.get("version")) or "", "name": data.get("name", "").strip()}
    return await _act(page, ref, "clone", "POST", f"/volumes/{seg(ref)}/clone", body, ("version", "name"), "name")


@router.get("/hub")
async def hub(page: Tenant) -> Response:
    return page.render("account/hub.html", models=await page.get("/hub/models"),
                       datasets=await page.get("/hub/datasets"), human=human)  # fmt: skip
