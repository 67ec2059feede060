"""Clusters an engine runs (Ray, Slurm): the nodes it reports, kept in step with the database.

Every few seconds the leader asks the engine for its nodes (`EngineNode`s) and `sync` makes the cluster's rows
match: a node that joined is registered (with its GPUs), one whose labels or size changed is re-placed in the
fabric, and the cluster's spec is rebuilt from what was found (`topology.discovered`), so the scheduler places on
the fabric as it is. A node the engine reports dead goes down through the health path that exists for every node:
work on it stops as a node failure, is requeued by its retry policy and credited. When it comes back, it is
ready again, unless the operator had drained it or put it down for a reason of their own. A node that vanished
from the engine's list stays, down, until the operator removes the cluster: its history and allocations name it.

suanli's node name is `<cluster>.<engine name>`; the engine's own handle (a Ray node id, a Slurm NodeName) and the
node's address are kept in its labels for the executor (`engine_host`, `address`).
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli import catalog
from suanli.control.errors import Conflict
from suanli.control.ids import new_id
from suanli.control.scheduling import inventory
from suanli.control.settings import Settings
from suanli.control.telemetry import health
from suanli.db.engine import Database
from suanli.db.models import ClusterRow, Gpu, Node
from suanli.executors.base import EngineNode
from suanli.topology.discovered import Host, discovered_spec

log = logging.getLogger("suanli.engines")
ENGINE_KINDS = ("ray", "slurm")
LEAF, SPINE, DOMAIN = "suanli.io/leaf", "suanli.io/spine", "suanli.io/nvlink-domain"
HOST_LABEL, ADDRESS_LABEL, EXTERNAL_LABEL = "engine_host", "address", "engine_busy_gpus"


@dataclass
class SyncReport:
    added: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    up: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # GPU nodes of a model the catalog does not know
    replaced: bool = False  # the spec changed (nodes joined, left the fabric, or were relabelled)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "node"


def node_name(cluster: str, engine_name: str) -> str:
    return f"{_slug(cluster)}.{_slug(engine_name)}"


def _model(n: EngineNode) -> str | None:
    if not n.gpu_model:
        return None
    try:
        return catalog.gpu(n.gpu_model).name
    except catalog.CatalogError:
        return None


def _host(name: str, model: str, gpus: int, cpus: int, mem: int, labels: dict[str, Any]) -> Host:
    return Host(name, model, gpus, cpus, mem, str(labels.get(LEAF, "")), str(labels.get(SPINE, "")),
                str(labels.get(DOMAIN, "")))  # fmt: skip


def sync(
    s: Session, cluster: str, kind: str, reported: list[EngineNode], fabric: str, now: datetime, nics: int = 1
) -> SyncReport:
    """Make cluster `cluster` (of `kind`: ray | slurm) match the nodes the engine reports now."""
    report = SyncReport()
    row = s.scalar(select(ClusterRow).where(ClusterRow.name == cluster))
    if row is not None and row.source != kind:
        raise Conflict(
            f"a {row.source} cluster called {cluster!r} is registered; the {kind} cluster needs its own name"
        )
    by_name: dict[str, tuple[EngineNode, str]] = {}
    for n in reported:
        model = _model(n)
        if n.gpu_count <= 0:
            continue  # CPU-only nodes (a Ray head) run no GPU work; CPU work runs on this server's host
        if model is None:
            report.skipped.append(f"{n.name} ({n.gpu_model or 'no GPU model'})")
            continue
        by_name[node_name(cluster, n.name)] = (n, model)
    existing = {} if row is None else {x.name: x for x in s.scalars(select(Node).where(Node.cluster_id == row.id))}
    if row is None and not by_name:
        return report
    hosts = [_host(nm, m, n.gpu_count, n.cpu_count, n.memory_mib, n.labels) for nm, (n, m) in by_name.items()]
    hosts += [_host(nm, x.gpu_model or "", x.gpu_count, x.cpu_count, x.memory_mib, x.labels)
              for nm, x in existing.items() if nm not in by_name]  # fmt: skip
    spec, order = discovered_spec(cluster, hosts, fabric, nics, description=f"discovered from {kind}")
    if row is None:
        row = ClusterRow(id=new_id("cl"), name=cluster, source=kind, spec=spec, created_at=now)
        s.add(row)
        s.flush()
    current = [x.name for x in sorted(existing.values(), key=lambda x: x.index)]
    if spec != row.spec or order != current:
        _place(s, row, spec, order, by_name, existing, now, report)
    for nm, (n, _) in by_name.items():
        node = existing.get(nm) or s.scalar(select(Node).where(Node.name == nm))
        assert node is not None
        labels = {**{k: v for k, v in n.labels.items() if isinstance(v, str)}, HOST_LABEL: n.host,
                  ADDRESS_LABEL: n.address, EXTERNAL_LABEL: str(max(0, n.busy_gpus))}  # fmt: skip
        if node.labels != labels:
            if (node.labels or {}).get(EXTERNAL_LABEL) != labels[EXTERNAL_LABEL]:
                inventory.bump_version(s, fleet=True)  # the scheduler's view counts them: rebuild it
            node.labels = labels
        _liveness(s, node, kind, n.alive, n.reason, now, report)
    for nm, x in existing.items():
        if nm not in by_name:
            _liveness(s, x, kind, False, "no longer in the cluster", now, report)
    return report


def _liveness(s: Session, node: Node, kind: str, alive: bool, reason: str, now: datetime, report: SyncReport) -> None:
    mine = node.state_reason.startswith(f"{kind}: ")  # down because the engine said so, not the operator
    if alive and node.state == "down" and mine:
        health.set_state(s, node.name, "ready", f"{kind}: the node is back", now)
        report.up.append(node.name)
    elif not alive and node.state != "down":
        health.set_state(s, node.name, "down", f"{kind}: {reason or 'the node is dead'}", now)
        report.down.append(node.name)


def _place(
    s: Session, row: ClusterRow, spec: dict[str, Any], order: list[str], by_name: dict[str, tuple[EngineNode, str]],
    existing: dict[str, Node], now: datetime, report: SyncReport,
) -> None:  # fmt: skip
    """Put every node at its place in the new spec (inserting the new ones), then store the spec."""
    cluster = inventory.build_cluster(spec)
    for i, x in enumerate(existing.values()):  # out of the way of the unique (cluster, index) first
        x.index = -1 - i
    s.flush()
    domain, leaf, spine = cluster.node_domain.tolist(), cluster.node_leaf.tolist(), cluster.node_spine.tolist()
    for i, nm in enumerate(order):
        node = existing.get(nm)
        if node is None:
            n, model = by_name[nm]
            node = Node(id=new_id("node"), cluster_id=row.id, index=i, name=nm, kind=row.source, state="ready",
                        state_reason="", gpu_model=model, gpu_count=n.gpu_count, nvlink_domain=domain[i],
                        leaf=leaf[i], spine=spine[i], cpu_count=n.cpu_count, memory_mib=n.memory_mib,
                        labels={}, created_at=now)  # fmt: skip
            s.add(node)
            s.flush()
            _gpus(s, node, n.gpu_count, model)
            report.added.append(nm)
            continue
        node.index, node.nvlink_domain, node.leaf, node.spine = i, domain[i], leaf[i], spine[i]
        if nm in by_name:
            n, model = by_name[nm]
            if (node.gpu_count, node.gpu_model) != (n.gpu_count, model):
                s.query(Gpu).filter(Gpu.node_id == node.id).delete()
                node.gpu_count, node.gpu_model = n.gpu_count, model
                s.flush()
                _gpus(s, node, n.gpu_count, model)
            node.cpu_count, node.memory_mib = n.cpu_count, n.memory_mib
    row.spec = spec
    report.replaced = True
    inventory.bump_version(s, fleet=True)
    log.info("%s: cluster %s now has %d nodes (%s)", row.source, row.name, len(order),
             ", ".join(report.added) or "re-placed")  # fmt: skip


def _gpus(s: Session, node: Node, count: int, model: str) -> None:
    mem = int(catalog.gpu(model).memory_GB * 1000**3 / 2**20)
    for k in range(count):
        s.add(Gpu(node_id=node.id, index=k, model=model, memory_mib=mem, mig_mode=False,
                  uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'suanli:{node.name}:{k}')}"))  # fmt: skip


@dataclass
class Engine:
    """One engine the server runs on: its cluster's name and the executor that asks it for nodes."""

    kind: str
    cluster: str
    executor: Any  # has `nodes() -> list[EngineNode]`


def configured(settings: Settings) -> list[Engine]:
    """The engines the settings name (`ray_address`, `slurm`), with their executors; none by default."""
    from suanli.executors import executor
    from suanli.storage.archive import Limits

    out = []
    if settings.ray_address:
        out.append(Engine("ray", settings.ray_cluster,
                          executor("ray", address=settings.ray_address, namespace=settings.ray_namespace,
                                   workdir_limits=Limits(settings.workdir_max_bytes, settings.workdir_max_files))))  # fmt: skip
    if settings.slurm:
        out.append(Engine("slurm", settings.slurm_cluster,
                          executor("slurm", slurm_conf=settings.slurm_conf, partition=settings.slurm_partition,
                                   rest=settings.slurm_rest)))  # fmt: skip
    return out


@dataclass
class EngineSync:
    """Asks each engine for its nodes every `interval_s` and syncs them; an engine that cannot answer (Ray's head
    restarting, slurmctld down) leaves its cluster as it was and is asked again next time."""

    engines: list[Engine]
    fabric: str = "eth-100"
    nics: int = 1
    interval_s: float = 2.0
    _last: float = float("-inf")
    reports: dict[str, SyncReport] = field(default_factory=dict)

    def kick(self) -> None:
        """Ask the engines at the next tick, however recently they were asked."""
        self._last = float("-inf")

    def tick(self, db: Database, now: datetime, mono: float) -> None:
        if not self.engines or mono - self._last < self.interval_s:
            return
        self._last = mono
        for e in self.engines:
            try:
                found = e.executor.nodes()
            except Exception as err:  # the engine is unreachable right now: nothing to conclude about its nodes
                log.warning("%s: could not list nodes: %s", e.kind, err)
                continue
            try:
                with db.write() as s, s.begin():
                    self.reports[e.kind] = sync(s, e.cluster, e.kind, found, self.fabric, now, self.nics)
            except Exception:
                log.exception("%s: syncing the cluster's nodes failed", e.kind)
