"""A Ray cluster's nodes as suanli sees them (`EngineNode`): a pure mapping of what `ray.nodes()` returns.

Names must survive a Ray restart (a node id does not), so a node is called, in order:

1. its `suanli.io/name` label (`ray start --labels suanli.io/name=gpu-07`): what to set when one host runs several
   Ray nodes, or the hostname is not what the operator wants to see;
2. its hostname, when no other node on the cluster has the same one (one Ray node per host, the usual case);
3. `<hostname>-<node manager port>` otherwise: stable only if the operator fixes `--node-manager-port`.

The GPU model comes from the `suanli.io/gpu` label, else from Ray's own `accelerator_type:<T>` resource, and is
the catalog's name for it (`H100` → `H100-SXM`); a model the catalog does not know is None (the label stays in
`labels`). Ray keeps dead nodes in its table: one appears with alive=False and Ray's reason unless a live node has
taken its name (a restarted node has a new id, the same name).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from suanli.executors.base import EngineNode

NAME_LABEL = "suanli.io/name"
GPU_LABEL = "suanli.io/gpu"
LABEL_PREFIX = "suanli.io/"
ACCELERATOR_PREFIX = "accelerator_type:"
OWN_PREFIX = "suanli:"  # our placement groups' names; their GPUs are ours, not "busy"

# Ray's DeathReason enum (gcs.proto NodeDeathInfo.Reason), for when it gives no message.
DEATH_REASONS = {
    0: "unspecified",
    1: "unexpected termination (the raylet died or missed its health checks)",
    2: "expected termination (ray stop)",
    3: "autoscaler drain: the node was idle",
    4: "autoscaler drain: the node was preempted",
}


def gpu_model(labels: Mapping[str, str], resources: Mapping[str, float]) -> str | None:
    """The catalog's name of the node's GPU model, from the label or Ray's accelerator resource; None if unknown."""
    from suanli import catalog
    from suanli.catalog import CatalogError

    wanted = labels.get(GPU_LABEL) or next(
        (k[len(ACCELERATOR_PREFIX) :] for k in resources if k.startswith(ACCELERATOR_PREFIX)), None
    )
    if not wanted:
        return None
    try:
        return str(catalog.gpu(wanted).name)
    except CatalogError:
        return None


def _death_reason(raw: Mapping[str, Any]) -> str:
    message = str(raw.get("DeathReasonMessage") or "").strip()
    if message:
        return message
    code = raw.get("DeathReason")
    return DEATH_REASONS.get(code, f"death reason {code}") if isinstance(code, int) else "the node is dead"


def _base_names(raws: list[Mapping[str, Any]]) -> list[str]:
    hosts = Counter(
        str(r.get("NodeManagerHostname") or "")
        for r in raws
        if r.get("Alive") and not (r.get("Labels") or {}).get(NAME_LABEL)
    )
    names = []
    for r in raws:
        labels = r.get("Labels") or {}
        host = str(r.get("NodeManagerHostname") or r.get("NodeManagerAddress") or r.get("NodeID", "")[:12])
        if labels.get(NAME_LABEL):
            names.append(str(labels[NAME_LABEL]))
        elif hosts[host] <= 1:
            names.append(host)
        else:
            names.append(f"{host}-{r.get('NodeManagerPort')}")
    return names


def own_gpus(placement_groups: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """GPUs per Ray node id that suanli's own live placement groups hold (`ray.util.placement_group_table()`)."""
    held: dict[str, float] = {}
    for pg in placement_groups.values():
        if not str(pg.get("name", "")).startswith(OWN_PREFIX) or pg.get("state") == "REMOVED":
            continue
        where = pg.get("bundles_to_node_id") or {}
        for index, bundle in (pg.get("bundles") or {}).items():
            node = where.get(index)
            if node:
                held[node] = held.get(node, 0.0) + float(bundle.get("GPU", 0.0))
    return held


def engine_nodes(
    raws: Iterable[Mapping[str, Any]],
    available: Mapping[str, Mapping[str, float]] | None = None,
    ours: Mapping[str, float] | None = None,
) -> list[EngineNode]:
    """`ray.nodes()` entries → EngineNodes, sorted by name. `available` (node id → free resources) and `ours`
    (`own_gpus`) give `busy_gpus`: GPUs neither free nor held by suanli (other Ray users' work); 0 without them."""
    rows = [r for r in raws if r.get("NodeID")]
    names = _base_names(rows)
    alive_names = {n for n, r in zip(names, rows, strict=True) if r.get("Alive")}
    found: dict[str, EngineNode] = {}
    for name, r in zip(names, rows, strict=True):
        alive = bool(r.get("Alive"))
        if not alive and name in alive_names:
            continue  # an earlier life of a node that is back under a new id
        node_id = str(r["NodeID"])
        resources = r.get("Resources") or {}
        labels = {str(k): str(v) for k, v in (r.get("Labels") or {}).items() if str(k).startswith(LABEL_PREFIX)}
        gpus = int(resources.get("GPU", 0))
        busy = 0
        if alive and available is not None and node_id in available:
            free = float(available[node_id].get("GPU", 0.0))
            held = float((ours or {}).get(node_id, 0.0))
            busy = max(0, min(gpus, round(gpus - free - held)))
        found[name] = EngineNode(
            name=name,
            host=node_id,
            address=str(r.get("NodeManagerAddress") or ""),
            gpu_count=gpus,
            gpu_model=gpu_model(labels, resources) if gpus else None,
            cpu_count=int(resources.get("CPU", 0)),
            memory_mib=int(resources.get("memory", 0)) >> 20,
            alive=alive,
            labels=labels,
            busy_gpus=busy,
            reason="" if alive else _death_reason(r),
        )
    return sorted(found.values(), key=lambda n: n.name)
