"""`suanli topology …`: cluster presets and what a cluster looks like tier by tier."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from suanli import topology
from suanli.cli import common
from suanli.cli.common import JsonOpt, console, user_errors
from suanli.topology import Cluster

app = typer.Typer(no_args_is_help=True, help="Cluster topologies: presets and tier structure.")


def _preset_row(name: str, cluster: Cluster) -> dict[str, Any]:
    return {
        "name": name,
        "gpus": cluster.n_gpus,
        "nodes": cluster.n_nodes,
        "gpu_models": sorted({g.gpu.name for g in cluster.groups}),
        "fabric": cluster.fabric.name if cluster.fabric else None,
        "description": cluster.description,
    }


@app.command()
def presets(json_out: JsonOpt = False) -> None:
    """The named clusters --cluster accepts (besides NxG[:MODEL] and YAML files)."""
    rows = [_preset_row(name, topology.load_preset(name)) for name in topology.preset_names()]
    if json_out:
        common.emit_json(rows)
        return
    table = Table(title="cluster presets (also: NxG[:MODEL] such as 16x8:H100, or a cluster YAML file)")
    table.add_column("name", no_wrap=True)
    table.add_column("GPUs", justify="right")
    table.add_column("GPU")
    table.add_column("fabric")
    table.add_column("description")
    for r in rows:
        table.add_row(r["name"], f"{r['gpus']:,}", ", ".join(r["gpu_models"]), r["fabric"] or "-", r["description"])
    console.print(table)


def _tiers(cluster: Cluster) -> list[dict[str, Any]]:
    """Per-GPU bottleneck bandwidth and latency of every tier that spans the whole cluster crosses."""
    links = cluster.tier_links(cluster.compact_gpus(cluster.n_gpus))
    cells = cluster.span(cluster.compact_gpus(cluster.n_gpus))
    return [
        {
            "tier": t.tier,
            "cells": cells.get(t.tier, t.cells),
            "uni_GBps_per_gpu": round(t.uni_GBps_per_gpu, 3),
            "latency_us": round(t.latency_us, 3),
        }
        for t in links.values()
    ]


@app.command()
def show(
    cluster: Annotated[str, typer.Argument(help="Preset name, NxG[:MODEL] shorthand or a cluster YAML file.")],
    json_out: JsonOpt = False,
) -> None:
    """A cluster's summary (nodes, GPUs, domains, leaves, spines, node groups) and its tier table."""
    with user_errors():
        c = common.load_cluster(cluster)
        doc = {**c.summary(), "description": c.description, "tiers": _tiers(c)}
    doc.update(
        nodes_per_leaf=c.nodes_per_leaf,
        leaves_per_spine=c.leaves_per_spine,
        leaf_oversubscription=c.leaf_oversubscription,
        spine_oversubscription=c.spine_oversubscription,
        rail_optimized=c.rail_optimized,
    )
    if json_out:
        common.emit_json(doc)
        return
    title = f"{c.name}: {c.n_gpus:,} GPUs on {c.n_nodes:,} nodes" + (f" - {c.description}" if c.description else "")
    summary = Table(title=title, show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    for key in ("nvlink_domains", "leaves", "spines", "fabric", "nodes_per_leaf", "leaves_per_spine"):
        summary.add_row(key.replace("_", " "), f"{doc[key]:,}" if isinstance(doc[key], int) else str(doc[key]))
    summary.add_row("oversubscription", f"leaf {c.leaf_oversubscription:g}:1, spine {c.spine_oversubscription:g}:1")
    console.print(summary)
    groups = Table(title="node groups")
    for col in ("group", "nodes", "GPU", "GPUs/node", "intra", "NICs", "NIC Gbit/s"):
        groups.add_column(col, justify="right" if col in ("nodes", "GPUs/node", "NICs", "NIC Gbit/s") else "left")
    for g in doc["groups"]:
        groups.add_row(g["name"], f"{g['nodes']:,}", g["gpu"], str(g["gpus_per_node"]), g["intra"], str(g["nics"]),
                       f"{g['nic_Gbps']:g}")  # fmt: skip
    console.print(groups)
    tiers = Table(title="tiers (crossed by a job on the whole cluster)")
    for col in ("tier", "cells", "GB/s per GPU", "latency us"):
        tiers.add_column(col, justify="left" if col == "tier" else "right")
    for t in doc["tiers"]:
        tiers.add_row(t["tier"], f"{t['cells']:,}", f"{t['uni_GBps_per_gpu']:.2f}", f"{t['latency_us']:.2f}")
    console.print(tiers)
