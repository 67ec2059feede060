"""The cluster as a tree of cells: GPU → NVLink domain → node → leaf → spine → core.

Nodes are stored column-wise (NumPy arrays of cell indices) so that a 100,000-GPU cluster is a few
arrays, and "which cells does this set of GPUs touch" is a vectorised unique-count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from suanli.catalog import FabricSpec, GPUSpec, IntraNodeLinkSpec

TIERS = ("nvlink", "node", "leaf", "spine", "core")


@dataclass(frozen=True)
class NodeGroup:
    """A homogeneous set of nodes: same GPU model, count, intra-node link and NICs."""

    name: str
    count: int
    gpu: GPUSpec
    gpus_per_node: int
    intra: IntraNodeLinkSpec
    nics: int
    nic_Gbps: float
    nvlink_domain_nodes: int = 1  # nodes per NVLink domain: 1 on HGX boards, 18 on an NVL72 rack
    cpus: int | None = None  # host CPU cores per node, when the operator states them (placement then counts them)
    memory_gib: float | None = None  # host memory per node

    @property
    def memory_mib(self) -> int:
        """Host memory per node in MiB; 0 when not stated."""
        return round(self.memory_gib * 1024) if self.memory_gib else 0

    @property
    def has_nvlink_domain(self) -> bool:
        return self.intra.kind == "nvlink"

    @property
    def nic_GBps_per_gpu(self) -> float:
        return self.nics * self.nic_Gbps / 8.0 / self.gpus_per_node


@dataclass(frozen=True)
class TierLink:
    """What a set of GPUs gets at the highest tier it crosses."""

    tier: str
    uni_GBps_per_gpu: float
    latency_us: float
    cells: int


@dataclass(frozen=True)
class CommGroup:
    """A set of GPUs reduced to what a collective cost model needs."""

    ranks: int
    gpu: GPUSpec
    domains: int  # NVLink domains touched (nodes, for PCIe-only boxes)
    ranks_per_domain: int  # largest number of ranks inside one domain
    nodes: int
    intra_GBps: float  # per-GPU unidirectional bandwidth inside a domain
    intra_latency_us: float
    intra_kind: str  # "nvlink" or "pcie"
    nvls: bool  # NVLink SHARP usable inside the domain
    inter: TierLink | None  # None when the set fits in one domain
    fabric: FabricSpec | None
    nics_per_domain_rank: float = 1.0  # NICs available per rank in a domain (rail-optimised boards: 1)
    min_ranks_per_domain: int = 0  # smallest number of ranks in one domain (0: same as ranks_per_domain)

    @property
    def single_domain(self) -> bool:
        return self.domains == 1


@dataclass(frozen=True)
class Cluster:
    """An immutable cluster: node groups placed under a leaf/spine/core fabric."""

    name: str
    groups: tuple[NodeGroup, ...]
    fabric: FabricSpec | None
    nodes_per_leaf: int | tuple[int, ...]  # a list: the size of each leaf in turn (a discovered, uneven fabric)
    leaves_per_spine: int | tuple[int, ...]
    leaf_oversubscription: float = 1.0
    spine_oversubscription: float = 1.0
    rail_optimized: bool = True
    description: str = ""
    # column arrays, built in __post_init__
    node_group: NDArray[np.int32] = field(init=False, repr=False)
    node_first_gpu: NDArray[np.int64] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a cluster needs at least one node group")
        counts = np.array([g.count for g in self.groups])
        node_group = np.repeat(np.arange(len(self.groups), dtype=np.int32), counts)
        gpn = np.array([g.gpus_per_node for g in self.groups], dtype=np.int64)[node_group]
        first = np.concatenate(([0], np.cumsum(gpn)[:-1])).astype(np.int64)
        object.__setattr__(self, "node_group", node_group)
        object.__setattr__(self, "node_first_gpu", first)
        if isinstance(self.nodes_per_leaf, tuple) and (
            sum(self.nodes_per_leaf) != len(node_group) or min(self.nodes_per_leaf) < 1
        ):
            raise ValueError(f"nodes_per_leaf: leaf sizes {list(self.nodes_per_leaf)} must be positive and add up to "
                             f"the {len(node_group)} nodes")  # fmt: skip
        if isinstance(self.leaves_per_spine, tuple):
            leaves = int(self.node_leaf[-1]) + 1
            if sum(self.leaves_per_spine) != leaves or min(self.leaves_per_spine) < 1:
                raise ValueError(f"leaves_per_spine: spine sizes {list(self.leaves_per_spine)} must be positive and "
                                 f"add up to the {leaves} leaves")  # fmt: skip

    # ---- sizes -------------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return int(self.node_group.shape[0])

    @cached_property
    def n_gpus(self) -> int:
        return int(sum(g.count * g.gpus_per_node for g in self.groups))

    @cached_property
    def node_leaf(self) -> NDArray[np.int64]:
        if isinstance(self.nodes_per_leaf, tuple):
            return np.repeat(np.arange(len(self.nodes_per_leaf), dtype=np.int64), self.nodes_per_leaf)
        return np.arange(self.n_nodes, dtype=np.int64) // self.nodes_per_leaf

    @cached_property
    def node_spine(self) -> NDArray[np.int64]:
        if isinstance(self.leaves_per_spine, tuple):
            leaf_spine = np.repeat(np.arange(len(self.leaves_per_spine), dtype=np.int64), self.leaves_per_spine)
            return leaf_spine[self.node_leaf]
        return self.node_leaf // self.leaves_per_spine

    @cached_property
    def node_domain(self) -> NDArray[np.int64]:
        """NVLink domain of each node; nodes of groups without NVLink form a domain of their own."""
        out = np.empty(self.n_nodes, dtype=np.int64)
        base = 0
        start = 0
        for g in self.groups:
            per = g.nvlink_domain_nodes if g.has_nvlink_domain else 1
            local = np.arange(g.count, dtype=np.int64) // per
            out[start : start + g.count] = base + local
            base += int(local[-1]) + 1 if g.count else 0
            start += g.count
        return out

    @cached_property
    def gpu_node(self) -> NDArray[np.int64]:
        gpn = np.array([g.gpus_per_node for g in self.groups], dtype=np.int64)[self.node_group]
        return np.repeat(np.arange(self.n_nodes, dtype=np.int64), gpn)

    @property
    def n_leaves(self) -> int:
        return int(self.node_leaf[-1]) + 1

    @property
    def n_spines(self) -> int:
        return int(self.node_spine[-1]) + 1

    def group_of(self, node: int) -> NodeGroup:
        return self.groups[int(self.node_group[node])]

    def node_name(self, node: int) -> str:
        g = self.node_group[node]
        first = int(np.searchsorted(self.node_group, g))
        return f"{self.groups[g].name}-{node - first:04d}"

    def gpus_of_node(self, node: int) -> range:
        first = int(self.node_first_gpu[node])
        return range(first, first + self.group_of(node).gpus_per_node)

    # ---- queries -----------------------------------------------------------------------------------
    def span(self, gpus: NDArray[np.integer] | list[int]) -> dict[str, int]:
        """How many cells of each tier a set of GPUs touches."""
        ids = np.asarray(gpus, dtype=np.int64)
        if ids.size == 0:
            return dict.fromkeys(TIERS, 0)
        if ids.min() < 0 or ids.max() >= self.n_gpus:
            raise ValueError(f"GPU index out of range 0..{self.n_gpus - 1}")
        nodes = np.unique(self.gpu_node[ids])
        return {
            "nvlink": int(np.unique(self.node_domain[nodes]).size),
            "node": int(nodes.size),
            "leaf": int(np.unique(self.node_leaf[nodes]).size),
            "spine": int(np.unique(self.node_spine[nodes]).size),
            "core": 1,
        }

    def tier_links(self, gpus: NDArray[np.integer] | list[int]) -> dict[str, TierLink]:
        """Bottleneck per-GPU bandwidth and latency of every tier the set crosses."""
        ids = np.asarray(gpus, dtype=np.int64)
        span = self.span(ids)
        nodes = np.unique(self.gpu_node[ids])
        groups = {int(self.node_group[n]) for n in nodes}
        gs = [self.groups[i] for i in groups]
        out: dict[str, TierLink] = {}
        intra = min(gs, key=lambda g: g.intra.uni_GBps)
        intra_name = "nvlink" if intra.has_nvlink_domain else "node"
        out[intra_name] = TierLink(intra_name, intra.intra.uni_GBps, intra.intra.latency_us, span[intra_name])
        if span["nvlink"] > 1 and self.fabric is not None:
            nic = min(g.nic_GBps_per_gpu for g in gs)
            nic_lat = 2 * self.fabric.nic_latency_us
            hop = self.fabric.switch_hop_latency_us
            out["leaf"] = TierLink("leaf", nic, nic_lat + hop, span["leaf"])
            if span["leaf"] > 1:
                out["spine"] = TierLink("spine", nic / self.leaf_oversubscription, nic_lat + 3 * hop, span["spine"])
            if span["spine"] > 1:
                bw = nic / self.leaf_oversubscription / self.spine_oversubscription
                out["core"] = TierLink("core", bw, nic_lat + 5 * hop, 1)
        return out

    def comm_group(self, gpus: NDArray[np.integer] | list[int]) -> CommGroup:
        """Summarise a set of GPUs for the collective cost model."""
        ids = np.asarray(gpus, dtype=np.int64)
        if ids.size == 0:
            raise ValueError("empty GPU set")
        links = self.tier_links(ids)
        nodes = self.gpu_node[ids]
        domains = self.node_domain[nodes]
        _, per_domain = np.unique(domains, return_counts=True)
        groups = {int(g) for g in np.unique(self.node_group[nodes])}
        gs = [self.groups[i] for i in groups]
        slowest = min(gs, key=lambda g: g.gpu.tflops.get("bf16") or g.gpu.tflops["fp32"] or 0.0)
        intra_tier = links.get("nvlink") or links["node"]
        inter = None
        for tier in ("core", "spine", "leaf"):
            if tier in links:
                inter = links[tier]
                break
        gpn = max(g.gpus_per_node for g in gs)
        nics = min(g.nics for g in gs)
        return CommGroup(
            ranks=int(ids.size),
            gpu=slowest.gpu,
            domains=int(per_domain.size),
            ranks_per_domain=int(per_domain.max()),
            nodes=int(np.unique(nodes).size),
            intra_GBps=intra_tier.uni_GBps_per_gpu,
            intra_latency_us=intra_tier.latency_us,
            intra_kind="nvlink" if all(g.has_nvlink_domain for g in gs) else "pcie",
            nvls=all(g.has_nvlink_domain for g in gs) and slowest.gpu.nvls_capable,
            inter=inter,
            fabric=self.fabric,
            nics_per_domain_rank=nics / gpn if gpn else 0.0,
            min_ranks_per_domain=int(per_domain.min()),
        )

    def compact_gpus(self, count: int, group: int | None = None) -> NDArray[np.int64]:
        """The most compact set of `count` GPUs: whole nodes in order, starting at the first node."""
        nodes = np.arange(self.n_nodes) if group is None else np.flatnonzero(self.node_group == group)
        gpn = np.array([g.gpus_per_node for g in self.groups], dtype=np.int64)[self.node_group[nodes]]
        need = int(np.searchsorted(np.cumsum(gpn), count)) + 1 if count else 0
        chosen = nodes[:need]
        gpus = (
            np.concatenate(
                [np.arange(self.node_first_gpu[n], self.node_first_gpu[n] + gpn[i]) for i, n in enumerate(chosen)]
            )
            if need
            else np.empty(0, np.int64)
        )
        if gpus.size < count:
            raise ValueError(f"cluster {self.name} has {gpus.size} GPUs, {count} requested")
        return gpus[:count]

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "nodes": self.n_nodes,
            "gpus": self.n_gpus,
            "nvlink_domains": int(self.node_domain[-1]) + 1,
            "leaves": self.n_leaves,
            "spines": self.n_spines,
            "fabric": self.fabric.name if self.fabric else None,
            "groups": [
                {
                    "name": g.name,
                    "nodes": g.count,
                    "gpu": g.gpu.name,
                    "gpus_per_node": g.gpus_per_node,
                    "intra": g.intra.name,
                    "nics": g.nics,
                    "nic_Gbps": g.nic_Gbps,
                }
                for g in self.groups
            ],
        }
