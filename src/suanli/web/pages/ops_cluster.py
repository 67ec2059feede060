"""The cluster as it is wired: every GPU a cell, inside its NVLink domain, node, leaf switch and spine.

The structure (boxes and cells, in the order of `/admin/nodes`) is rendered once; the colours come from a compact
JSON state (the page carries the first one inline, then `static/ops_cluster.js` polls `/ops/cluster/_/state`), so a
refresh repaints cells and never rebuilds the page. Above `AGGREGATE_ABOVE` GPUs a cell stands for a whole node.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from markupsafe import Markup

from suanli.web.pages.ops_common import Operator
from suanli.web.session import Page

router = APIRouter()

AGGREGATE_ABOVE = 4096  # GPUs; above this the map draws one cell per node
NODES_LIMIT = 20_000  # the API's own bound on one page of /admin/nodes
POLL_MS = 3000
# health codes of a cell, worst last: what the page's legend and colours index
OK, DRAINING, DOWN, UNHEALTHY = 0, 1, 2, 3


async def _inventory(page: Page) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    clusters = await page.get("/admin/clusters")
    nodes = await page.get("/admin/nodes", limit=NODES_LIMIT)
    gpus = await page.get("/admin/gpus")
    return clusters, nodes, gpus


def _by_node(gpus: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for g in gpus:
        out.setdefault(g["node"], []).append(g)
    return out


def version(nodes: list[dict[str, Any]], per_node: dict[str, list[dict[str, Any]]]) -> str:
    """A short digest of the wiring (nodes, their places and GPU counts): the page reloads when it changes."""
    text = "|".join(f"{n['name']}:{n['spine']}:{n['leaf']}:{n['nvlink_domain']}:{len(per_node.get(n['name'], []))}"
                    for n in nodes)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def layout(clusters: list[dict[str, Any]], nodes: list[dict[str, Any]], per_node: dict[str, list[dict[str, Any]]],
           aggregate: bool) -> list[dict[str, Any]]:  # fmt: skip
    """Cluster → spine → leaf → NVLink domain → node → cells, each level in the API's order (its index)."""
    names = {c["id"]: c["name"] for c in clusters}
    tree: dict[str, dict[int, dict[int, dict[int, list[dict[str, Any]]]]]] = {}
    for n in nodes:
        gpus = per_node.get(n["name"], [])
        cells = 1 if aggregate else len(gpus)
        node = {"name": n["name"], "state": n["state"], "model": n["gpu_model"] or "CPU", "gpus": len(gpus),
                "cells": cells, "cols": _cols(cells)}  # fmt: skip
        c = tree.setdefault(n["cluster_id"], {})
        c.setdefault(n["spine"], {}).setdefault(n["leaf"], {}).setdefault(n["nvlink_domain"], []).append(node)
    out = []
    for cid, spines in tree.items():
        out.append({"id": cid, "name": names.get(cid, cid),
                    "gpus": sum(nd["gpus"] for sp in spines.values() for lf in sp.values() for d in lf.values()
                                for nd in d),
                    "spines": [{"id": sp, "leaves": [{"id": lf, "domains": [{"id": d, "nodes": ns}
                                                                           for d, ns in doms.items()]}
                                                     for lf, doms in leaves.items()]}
                               for sp, leaves in spines.items()]})  # fmt: skip
    return out


def _cols(cells: int) -> int:
    """Cells per row inside a node box: 8 GPUs draw as 4×2, 4 as 2×2, 72 as 9×8."""
    if cells <= 3:
        return max(cells, 1)
    return cells // 2 if cells <= 16 else math.ceil(math.sqrt(cells))


def _health(g: dict[str, Any]) -> int:
    if not g["healthy"]:
        return UNHEALTHY
    return {"down": DOWN, "draining": DRAINING}.get(g["node_state"], OK)


def _num(x: Any) -> int | None:
    return None if x is None else round(float(x))


def state(nodes: list[dict[str, Any]], per_node: dict[str, list[dict[str, Any]]], aggregate: bool,
          org_names: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """The colours' inputs, per node: [utilisation %, temperature °C, health code, owner index] per cell (null:
    no recent sample). Aggregated, a node's one cell holds the mean utilisation, the hottest GPU, the worst health
    and the org holding most of its GPUs."""
    owners: list[str] = []
    index: dict[str, int] = {}

    def owner(org: str) -> int:
        if not org:
            return -1
        if org not in index:
            index[org] = len(owners)
            owners.append(org_names.get(org, org))
        return index[org]

    out: dict[str, Any] = {}
    for n in nodes:
        gpus = per_node.get(n["name"], [])
        cells = [[_num(g["util"]), _num(g["temp_c"]), _health(g), owner(g.get("org") or "")] for g in gpus]
        if aggregate and cells:
            utils = [c[0] for c in cells if c[0] is not None]
            temps = [c[1] for c in cells if c[1] is not None]
            held = Counter(c[3] for c in cells if c[3] >= 0)
            cells = [[round(sum(utils) / len(utils)) if utils else None, max(temps) if temps else None,
                      max(c[2] for c in cells), held.most_common(1)[0][0] if held else -1]]  # fmt: skip
        out[n["name"]] = cells
    return {"nodes": out, "owners": owners}


async def _org_names(page: Page) -> dict[str, str]:
    return {o["id"]: o["name"] for o in await page.get("/admin/orgs", limit=10_000)}


async def _model(page: Page) -> dict[str, Any]:
    clusters, nodes, gpus = await _inventory(page)
    per_node = _by_node(gpus)
    aggregate = len(gpus) > AGGREGATE_ABOVE
    st = state(nodes, per_node, aggregate, await _org_names(page))
    return {"clusters": layout(clusters, nodes, per_node, aggregate), "aggregate": aggregate,
            "state": {**st, "v": version(nodes, per_node)}, "gpus": len(gpus), "nodes": len(nodes)}  # fmt: skip


@router.get("/ops/cluster")
async def cluster_page(page: Operator) -> Response:
    m = await _model(page)
    cell = 12 if m["gpus"] <= 1024 else 9 if not m["aggregate"] else 7
    inline = Markup(json.dumps(m["state"], separators=(",", ":")).replace("<", "\\u003c"))
    return page.render("ops/cluster.html", cell=cell, poll_ms=POLL_MS, state_json=inline, **m)


@router.get("/ops/cluster/_/state")
async def cluster_state(page: Operator) -> Response:
    """The live part: the cells' colours' inputs and the wiring's digest, polled by the page."""
    nodes = await page.get("/admin/nodes", limit=NODES_LIMIT)
    gpus = await page.get("/admin/gpus")
    per_node = _by_node(gpus)
    st = state(nodes, per_node, len(gpus) > AGGREGATE_ABOVE, await _org_names(page))
    return page.finish(JSONResponse({**st, "v": version(nodes, per_node)}))
