"""Nodes and their health: the list, one node with its GPUs and health events, drain/undrain with a reason, and
fault injection into a virtual node's simulated GPUs (what `PATCH /admin/nodes/{node}` and
`POST /admin/nodes/{node}/faults` do)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.forms import as_int
from suanli.web.pages.account_forms import seg
from suanli.web.pages.ops_common import Operator, error_page, errors
from suanli.web.session import Page

router = APIRouter()
STATES = ("ready", "draining", "down")
FAULTS = ("overtemp", "xid", "ecc_dbe", "off_bus", "silent")


@router.get("/ops/nodes")
async def nodes_page(page: Operator, state: str | None = None) -> Response:
    wanted = state if state in STATES else None
    nodes = await page.get("/admin/nodes", state=wanted, limit=20_000)
    clusters = {c["id"]: c["name"] for c in await page.get("/admin/clusters")}
    return page.render("ops/nodes.html", nodes=nodes, clusters=clusters, state=wanted, states=STATES)


async def _node(page: Page, node: str, **extra: Any) -> Response:
    n = await page.get(f"/admin/nodes/{seg(node)}")
    events = await page.get(f"/admin/nodes/{seg(node)}/events", limit=200)
    readings = {g["gpu"]: g for g in await page.get("/admin/gpus") if g["node"] == n["name"]}
    status = extra.pop("status", 200)
    return page.render("ops/node.html", status=status, node=n, events=list(reversed(events)), readings=readings,
                       states=STATES, faults=FAULTS, **{"errors": {}, "form": {}, **extra})  # fmt: skip


@router.get("/ops/nodes/{node}")
async def node_page(node: str, page: Operator) -> Response:
    try:
        return await _node(page, node)
    except ApiError as e:
        if e.status == 404:
            return error_page(page, 404, e.detail)
        raise


def _back(node: str) -> Response:
    return RedirectResponse(f"/ops/nodes/{seg(node)}", status_code=303)


@router.post("/ops/nodes/{node}/state")
async def set_state(node: str, request: Request, page: Operator) -> Response:
    """Drain, take down or bring back a node, with the reason the operator gives (kept on the node)."""
    data = await session.form(request, page)
    body = {"state": data.get("state", ""), "reason": data.get("reason", "")}
    try:
        await page.api("PATCH", f"/admin/nodes/{seg(node)}", json=body)
    except ApiError as e:
        if e.status == 404:
            return error_page(page, 404, e.detail)
        return await _node(page, node, status=e.status, errors=errors(e, "state"), form=data)
    return _back(node)


@router.post("/ops/nodes/{node}/faults")
async def inject_fault(node: str, request: Request, page: Operator) -> Response:
    """A simulated fault on a virtual node's GPU: the next samples carry it and the health rules act on it."""
    data = await session.form(request, page)
    body: dict[str, Any] = {"gpu": as_int(data.get("gpu")), "kind": data.get("kind", "")}
    if data.get("xid"):
        body["xid"] = as_int(data["xid"])
    try:
        await page.api("POST", f"/admin/nodes/{seg(node)}/faults", json=body)
    except ApiError as e:
        if e.status == 404:
            return error_page(page, 404, e.detail)
        return await _node(page, node, status=e.status, errors=errors(e, "gpu"), form=data)
    return _back(node)
