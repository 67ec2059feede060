"""Cluster topology: cells, tiers, bottleneck queries, specs and presets."""

from suanli.topology.model import TIERS, Cluster, CommGroup, NodeGroup, TierLink
from suanli.topology.presets import PRESETS, homogeneous, load_preset, preset_names, resolve
from suanli.topology.spec import ClusterSpec, SpecError, parse

__all__ = [
    "PRESETS",
    "TIERS",
    "Cluster",
    "ClusterSpec",
    "CommGroup",
    "NodeGroup",
    "SpecError",
    "TierLink",
    "homogeneous",
    "load_preset",
    "parse",
    "preset_names",
    "resolve",
]
