"""A tenant's instances and how to enter them: JupyterLab through the server's proxy (`POST
/workloads/{ref}/proxy` gives a one-minute, single-use link; the browser follows it) and SSH through the gateway
(`GET /ssh`: its port and host key; the login name is the instance), with a plain note where either is not there."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.pages.workloads import ACTIVE, ref_path
from suanli.web.session import Page

router = APIRouter()
Tenant = Annotated[Page, Depends(session.tenant)]


async def _render(page: Page, status: int = 200, error: str | None = None) -> Response:
    rows = [w for w in await page.get("/workloads", org=page.org["id"] or None, all=True) if w["kind"] == "instance"]
    ssh: dict[str, Any] = await page.get("/ssh")
    keys = await page.get("/keys")
    host = page.request.url.hostname or "HOST"
    return page.render("work/instances.html", status=status, rows=rows, ssh=ssh, keys=len(keys), host=host,
                       active=ACTIVE, error=error)  # fmt: skip


@router.get("/instances")
async def instances(page: Tenant) -> Response:
    return await _render(page)


@router.post("/instances/{ref}/lab")
async def open_lab(request: Request, page: Tenant, ref: str) -> Response:
    """Open the instance's JupyterLab: the API's single-use link, followed at once (it never sits in a page)."""
    await session.form(request, page)
    try:
        link = (await page.api("POST", ref_path(ref) + "/proxy", json={})).json()
    except ApiError as e:
        if e.status >= 500:
            raise
        return await _render(page, status=e.status, error=e.detail)
    url = str(link["url"])
    if not (url.startswith("/i/") or url.startswith(("https://", "http://"))):
        return await _render(page, status=502, error=page.t("unexpected link from the server", "服务器返回了异常链接"))
    return RedirectResponse(url, status_code=303)
