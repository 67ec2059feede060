"""Registering nodes: from a topology preset or a cluster spec (virtual nodes), or this host through NVML.

A registration stores the cluster spec document next to its node and GPU rows, so the same `topology.Cluster`
the scheduler and the performance model use can be rebuilt exactly from the database. Every change bumps the
inventory version, which is what cached offers key on.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from suanli.control.errors import Conflict, Invalid, NotFound
from suanli.control.ids import new_id
from suanli.db.models import Allocation, ClusterRow, Gpu, KeyValue, Node
from suanli.telemetry.nvml import HostInfo, catalog_model
from suanli.topology import Cluster, presets
from suanli.topology.spec import SpecError, parse

NODE_STATES = ("ready", "draining", "down")
INVENTORY_VERSION = "inventory_version"
FLEET_VERSION = "fleet_version"  # nodes and their states only (allocations do not change it)
MAX_REGISTERED_GPUS = 200_000
NODE_NAME_MAX = 255


def bump_version(s: Session, *, fleet: bool = False) -> None:
    """One atomic upsert: concurrent registrations and allocations never race on creating the row. `fleet`: the
    nodes themselves changed (registered, removed, drained), not only who holds their GPUs."""
    ins = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    for key in (INVENTORY_VERSION, FLEET_VERSION) if fleet else (INVENTORY_VERSION,):
        stmt = ins(KeyValue).values(key=key, value=1)
        s.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": KeyValue.value + 1}))


def fleet_version(s: Session) -> int:
    return s.scalar(select(KeyValue.value).where(KeyValue.key == FLEET_VERSION)) or 0


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "cluster"


def host_node_name(hostname: str) -> str:
    """The node name `register_host` gives a host."""
    return _slug(hostname)


def build_cluster(spec: dict[str, Any]) -> Cluster:
    try:
        return parse(spec)
    except SpecError as e:
        raise Invalid(f"spec: {e}") from e


def register_spec(
    s: Session, spec: dict[str, Any], now: datetime, *, source: str = "spec", name: str | None = None
) -> ClusterRow:
    """Virtual nodes for every node of the spec, placed in its NVLink domains, leaves and spines."""
    spec = {**spec, "name": name or spec.get("name")}
    cluster = build_cluster(spec)
    if cluster.n_gpus > MAX_REGISTERED_GPUS:
        raise Invalid(f"spec: {cluster.n_gpus} GPUs is more than one registration takes ({MAX_REGISTERED_GPUS})")
    if s.scalar(select(ClusterRow.id).where(ClusterRow.name == cluster.name)):
        raise Conflict(f"name: a cluster called {cluster.name!r} is registered; remove it first or pick another name")
    row = ClusterRow(id=new_id("cl"), name=cluster.name, source=source, spec=spec, created_at=now)
    s.add(row)
    s.flush()
    prefix = _slug(cluster.name)
    nodes: list[dict[str, Any]] = []
    gpus: list[dict[str, Any]] = []
    domain, leaf, spine = cluster.node_domain.tolist(), cluster.node_leaf.tolist(), cluster.node_spine.tolist()
    for i in range(cluster.n_nodes):
        g = cluster.group_of(i)
        node_id = new_id("node")
        node_name = f"{prefix}.{cluster.node_name(i)}"
        nodes.append(
            dict(id=node_id, cluster_id=row.id, index=i, name=node_name, kind="virtual", state="ready",
                 state_reason="", gpu_model=g.gpu.name, gpu_count=g.gpus_per_node, nvlink_domain=domain[i],
                 leaf=leaf[i], spine=spine[i], cpu_count=g.cpus or 0,
                 memory_mib=g.memory_mib, labels={}, created_at=now)
        )  # fmt: skip
        mem = int(g.gpu.memory_GB * 1000**3 / 2**20)
        for k in range(g.gpus_per_node):
            gpus.append(
                dict(node_id=node_id, index=k, model=g.gpu.name, memory_mib=mem, mig_mode=False,
                     uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'suanli:{row.id}:{i}:{k}')}")
            )  # fmt: skip
    _check_names(s, [n["name"] for n in nodes])
    s.execute(insert(Node), nodes)
    s.execute(insert(Gpu), gpus)
    bump_version(s, fleet=True)
    return row


def _check_names(s: Session, names: list[str]) -> None:
    """Node names are global (the API addresses nodes by name): refuse a clash with another cluster's nodes."""
    too_long = next((n for n in names if len(n) > NODE_NAME_MAX), None)
    if too_long is not None:
        raise Invalid(f"name: node name {too_long!r} is longer than {NODE_NAME_MAX} characters; pick a shorter name")
    for i in range(0, len(names), 500):
        taken = s.scalars(select(Node.name).where(Node.name.in_(names[i : i + 500])).limit(1)).first()
        if taken is not None:
            raise Conflict(f"name: a node called {taken!r} is already registered (another cluster); pick another name")


def register_preset(s: Session, preset: str, now: datetime, name: str | None = None) -> ClusterRow:
    try:
        spec = presets.preset_spec(preset)
        build_cluster(spec)
    except (SpecError, Invalid) as e:
        raise Invalid(f"preset: {getattr(e, 'message', e)}") from e
    return register_spec(s, spec, now, source="preset", name=name)


def register_host(s: Session, host: HostInfo, now: datetime, name: str | None = None) -> ClusterRow:
    """This host as one `local` node: its real GPUs (UUIDs from NVML), or CPU-only when it has none."""
    name = name or host.hostname
    if s.scalar(select(ClusterRow.id).where(ClusterRow.name == name)):
        raise Conflict(f"name: a cluster called {name!r} is registered")
    models = {catalog_model(g.name) for g in host.gpus}
    model = models.pop() if len(models) == 1 else None
    if host.gpus and model is None:
        names = sorted({g.name for g in host.gpus})
        raise Invalid(f"this host's GPUs ({', '.join(names)}) are not one catalog model; register them from a spec")
    spec: dict[str, Any] = {"name": name, "host": host.summary()}
    if host.gpus:
        spec["node_groups"] = [
            {"name": _slug(host.hostname), "count": 1, "gpu": model, "gpus_per_node": len(host.gpus)}
        ]
    row = ClusterRow(id=new_id("cl"), name=name, source="local", spec=spec, created_at=now)
    s.add(row)
    s.flush()
    _check_names(s, [_slug(name)])
    node = Node(
        id=new_id("node"), cluster_id=row.id, index=0, name=_slug(name), kind="local", state="ready",
        state_reason="" if host.gpus else host.summary(), gpu_model=model, gpu_count=len(host.gpus),
        nvlink_domain=0, leaf=0, spine=0, cpu_count=host.cpu_count, memory_mib=host.memory_mib,
        labels={"driver": host.driver_version or "", "cuda": host.cuda_version or ""}, created_at=now,
    )  # fmt: skip
    s.add(node)
    s.flush()
    for g in host.gpus:
        s.add(Gpu(node_id=node.id, index=g.index, uuid=g.uuid, model=model or g.name, memory_mib=g.memory_mib,
                  mig_mode=g.mig_mode))  # fmt: skip
    bump_version(s, fleet=True)
    return row


def topology_key(row: ClusterRow) -> tuple[str, str]:
    """What a cached topology of a cluster row is valid for: its id and its spec, which changes when an engine's
    nodes join or leave (`control.scheduling.engines`); a preset's or a spec's never does."""
    digest = hashlib.sha1(json.dumps(row.spec, sort_keys=True, default=str).encode(), usedforsecurity=False)
    return row.id, digest.hexdigest()


def cluster_topology(row: ClusterRow) -> Cluster | None:
    """The topology of a registered cluster; None for a CPU-only host."""
    if "node_groups" not in row.spec:
        return None
    spec = {k: v for k, v in row.spec.items() if k != "host"}
    return build_cluster(spec)


def cluster_size(s: Session, cluster_id: str) -> tuple[int, int]:
    """(nodes, GPUs) of a registered cluster."""
    n, g = s.execute(
        select(func.count(Node.id), func.coalesce(func.sum(Node.gpu_count), 0)).where(Node.cluster_id == cluster_id)
    ).one()
    return int(n), int(g)


def clusters(s: Session) -> list[ClusterRow]:
    return list(s.scalars(select(ClusterRow).order_by(ClusterRow.created_at)))


def remove_cluster(s: Session, cluster: str) -> None:
    row = s.scalar(select(ClusterRow).where((ClusterRow.id == cluster) | (ClusterRow.name == cluster)))
    if row is None:
        raise NotFound(f"cluster {cluster} not found")
    names = set(s.scalars(select(Node.name).where(Node.cluster_id == row.id)))
    holding = sorted({wid or aid for aid, wid, placement in s.execute(
        select(Allocation.id, Allocation.workload, Allocation.placement).where(Allocation.stopped_at.is_(None))
    ) if names & set(placement or {})})  # fmt: skip
    if holding:
        raise Conflict(
            f"cluster {row.name}: {len(holding)} workload(s) still hold its GPUs ({', '.join(holding[:5])}"
            f"{', ...' if len(holding) > 5 else ''}); set its nodes down (which stops them) or wait for them to end"
        )
    node_ids = select(Node.id).where(Node.cluster_id == row.id)
    s.execute(delete(Gpu).where(Gpu.node_id.in_(node_ids)))
    s.execute(delete(Node).where(Node.cluster_id == row.id))
    s.delete(row)
    bump_version(s, fleet=True)


def nodes(
    s: Session, *, state: str | None = None, cluster: str | None = None, limit: int = 1000, offset: int = 0
) -> list[Node]:
    q = select(Node)
    if state:
        q = q.where(Node.state == state)
    if cluster:
        q = q.join(ClusterRow, ClusterRow.id == Node.cluster_id).where(
            (ClusterRow.id == cluster) | (ClusterRow.name == cluster)
        )
    return list(s.scalars(q.order_by(Node.cluster_id, Node.index).limit(limit).offset(offset)))


def node(s: Session, name: str) -> Node:
    row = s.scalar(select(Node).where((Node.id == name) | (Node.name == name)))
    if row is None:
        raise NotFound(f"node {name} not found")
    return row


def gpus_of(s: Session, node_id: str) -> list[Gpu]:
    return list(s.scalars(select(Gpu).where(Gpu.node_id == node_id).order_by(Gpu.index)))


def unhealthy_gpus(s: Session, node_ids: list[str]) -> dict[str, int]:
    """GPUs a health rule marked unhealthy, by node."""
    out: dict[str, int] = {}
    for i in range(0, len(node_ids), 500):
        q = (select(Gpu.node_id, func.count()).where(Gpu.node_id.in_(node_ids[i : i + 500]), Gpu.healthy.is_(False))
             .group_by(Gpu.node_id))  # fmt: skip
        out.update({nid: int(n) for nid, n in s.execute(q)})
    return out


def set_state(s: Session, name: str, state: str, reason: str = "") -> Node:
    """`draining`: running work finishes, nothing new is placed; `down`: out of service; `ready`: back."""
    if state not in NODE_STATES:
        raise Invalid(f"state: one of {', '.join(NODE_STATES)}")
    row = node(s, name)
    row.state, row.state_reason = state, reason[:1000]
    bump_version(s, fleet=True)
    return row
