"""Cluster specs: the YAML an operator writes, validated, and turned into a `Cluster`.

Parsing takes text or a mapping; reading the file is the caller's business (the core does no I/O).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from suanli import catalog
from suanli.topology.model import Cluster, NodeGroup


class SpecError(ValueError):
    """A cluster spec that does not validate; the message names the field."""


class NodeGroupSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    count: int = Field(ge=1, le=100_000)
    gpu: str
    gpus_per_node: int = Field(ge=1, le=72)
    intra: str | None = Field(None, description="intra-node link; default from the GPU (NVLink gen or PCIe gen)")
    nics: int = Field(1, ge=0, le=64)
    nic_gbps: float | None = Field(None, gt=0, le=12_800)
    nvlink_domain_nodes: int = Field(1, ge=1, le=72)
    cpus: int | None = Field(None, ge=1, le=4096, description="host CPU cores per node; unset: not counted")
    memory_gib: float | None = Field(None, gt=0, le=1 << 20, description="host memory per node; unset: not counted")


class FabricSpecIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str
    nic_gbps: float = Field(gt=0, le=12_800)


Size = Annotated[int, Field(ge=1, le=4096)]
Sizes = Annotated[list[Size], Field(min_length=1, max_length=100_000)]


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    node_groups: list[NodeGroupSpec] = Field(min_length=1)
    fabric: str | FabricSpecIn | None = None
    # A number: every leaf (spine) takes that many nodes (leaves) in turn. A list: the size of each in turn, for
    # a fabric as it was discovered (Slurm's topology.conf, Ray node labels), where leaves differ in size.
    nodes_per_leaf: Size | Sizes = 32
    leaves_per_spine: Size | Sizes = 16
    leaf_oversubscription: float = Field(1.0, ge=1.0, le=64.0)
    spine_oversubscription: float = Field(1.0, ge=1.0, le=64.0)
    rail_optimized: bool = True

    @model_validator(mode="after")
    def _unique_group_names(self) -> ClusterSpec:
        names = [g.name for g in self.node_groups]
        if len(set(names)) != len(names):
            raise ValueError("node_groups: group names must be unique")
        return self


def default_intra(gpu: catalog.GPUSpec, gpus_per_node: int) -> catalog.IntraNodeLinkSpec:
    """NVLink of the GPU's generation on NVLink boards, else its PCIe generation."""
    if gpu.nvlink is not None and gpus_per_node > 1:
        if gpu.nvlink_domain_size >= 72:
            return catalog.link("nvl72")
        for link in catalog.all_links():
            gen = int(link.name.removeprefix("nvlink").split("-")[0] or 0) if link.name.startswith("nvlink") else 0
            if gen == gpu.nvlink.gen and abs(link.uni_GBps - gpu.nvlink.uni_GBps) < 1e-6:
                return link
        return catalog.link(f"nvlink{gpu.nvlink.gen}")
    return catalog.link(f"pcie{gpu.pcie_gen}")


def build(spec: ClusterSpec) -> Cluster:
    try:
        fab = None
        if isinstance(spec.fabric, str):
            fab = catalog.fabric(spec.fabric)
        elif spec.fabric is not None:
            fab = catalog.fabric_for(spec.fabric.kind, spec.fabric.nic_gbps)
        groups = []
        for g in spec.node_groups:
            gpu = catalog.gpu(g.gpu)
            intra = catalog.link(g.intra) if g.intra else default_intra(gpu, g.gpus_per_node)
            nic_gbps = g.nic_gbps or (fab.port_Gbps if fab else 0.0)
            group = NodeGroup(g.name, g.count, gpu, g.gpus_per_node, intra, g.nics, nic_gbps, g.nvlink_domain_nodes)
            groups.append(replace(group, cpus=g.cpus, memory_gib=g.memory_gib))
    except catalog.CatalogError as e:
        raise SpecError(str(e)) from e
    if sum(g.count for g in groups) > 1 and fab is None:
        raise SpecError("fabric: a cluster of more than one node needs a scale-out fabric (e.g. ib-ndr, roce-400)")
    if sum(g.count for g in groups) > 1:
        for i, g in enumerate(groups):
            if g.nics == 0:
                raise SpecError(f"node_groups.{i}.nics: a multi-node cluster needs at least one scale-out NIC per node")
    per_leaf, per_spine = spec.nodes_per_leaf, spec.leaves_per_spine
    try:
        return Cluster(
            name=spec.name,
            groups=tuple(groups),
            fabric=fab,
            nodes_per_leaf=tuple(per_leaf) if isinstance(per_leaf, list) else per_leaf,
            leaves_per_spine=tuple(per_spine) if isinstance(per_spine, list) else per_spine,
            leaf_oversubscription=spec.leaf_oversubscription,
            spine_oversubscription=spec.spine_oversubscription,
            rail_optimized=spec.rail_optimized,
            description=spec.description,
        )
    except ValueError as e:
        raise SpecError(str(e)) from e


def _format_errors(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "spec"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def parse(data: str | dict[str, Any]) -> Cluster:
    """Build a cluster from YAML text or an already-parsed mapping."""
    if isinstance(data, str):
        try:
            data = yaml.safe_load(data)
        except yaml.YAMLError as e:
            raise SpecError(f"cluster spec is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise SpecError("cluster spec must be a mapping with name, node_groups and fabric")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_format_errors(e)) from e
    return build(spec)
