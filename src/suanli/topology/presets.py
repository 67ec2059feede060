"""Named clusters an operator can start from (and the scale-test preset)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from suanli.topology.model import Cluster
from suanli.topology.spec import SpecError, parse

PRESETS: dict[str, dict[str, Any]] = {
    "rtx4090-box": {
        "name": "rtx4090-box",
        "description": "one 8x RTX 4090 PCIe server (no NVLink, GeForce P2P off), 25GbE uplink",
        "node_groups": [{"name": "rtx4090", "count": 1, "gpu": "RTX-4090", "gpus_per_node": 8, "nics": 1}],
        "fabric": "eth-25",
    },
    "h20-roce800-128": {
        "name": "h20-roce800-128",
        "description": "16 nodes x 8 H20 (NVLink 4), 800G RoCE v2 per node (8x 100G rails), one leaf",
        "node_groups": [{"name": "h20", "count": 16, "gpu": "H20", "gpus_per_node": 8, "nics": 8, "nic_gbps": 100}],
        "fabric": "roce-800",
        "nodes_per_leaf": 16,
    },
    "h20-eth25g-128": {
        "name": "h20-eth25g-128",
        "description": "16 nodes x 8 H20 (NVLink 4), one 25GbE TCP NIC per node",
        "node_groups": [{"name": "h20", "count": 16, "gpu": "H20", "gpus_per_node": 8, "nics": 1}],
        "fabric": "eth-25",
        "nodes_per_leaf": 16,
    },
    "dgx-h100-superpod-su": {
        "name": "dgx-h100-superpod-su",
        "description": "one DGX SuperPOD scalable unit: 32 DGX H100, 8x 400G NDR rails, rail-optimised",
        "node_groups": [{"name": "dgx", "count": 32, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8}],
        "fabric": "ib-ndr",
        "nodes_per_leaf": 32,
    },
    "gb300-nvl72": {
        "name": "gb300-nvl72",
        "description": "one GB300 NVL72 rack: 18 compute trays x 4 GPUs in one 72-GPU NVLink domain, CX-8 800G",
        "node_groups": [
            {
                "name": "tray",
                "count": 18,
                "gpu": "GB300",
                "gpus_per_node": 4,
                "nics": 4,
                "nvlink_domain_nodes": 18,
            }
        ],
        "fabric": "ib-xdr",
        "nodes_per_leaf": 18,
    },
    "synthetic-100k": {
        "name": "synthetic-100k",
        "description": "scale test: 12,500 nodes x 8 H100 (100,000 GPUs), NDR rails, 32 nodes per leaf, 2:1 core",
        "node_groups": [{"name": "h100", "count": 12_500, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8}],
        "fabric": "ib-ndr",
        "nodes_per_leaf": 32,
        "leaves_per_spine": 16,
        "spine_oversubscription": 2.0,
    },
}

_HOMOGENEOUS = re.compile(r"^(?P<nodes>\d+)x(?P<gpn>\d+)(?::(?P<gpu>[A-Za-z0-9._-]+))?$")


def homogeneous(nodes: int, gpus_per_node: int, gpu: str = "H100-SXM", fabric: str | None = None) -> dict[str, Any]:
    """Spec of N nodes x G GPUs under leaves of 32 nodes (the `NxG[:MODEL]` shorthand)."""
    from suanli import catalog

    spec_gpu = catalog.gpu(gpu)
    default_fabric = "ib-ndr" if spec_gpu.arch in ("hopper", "blackwell") else "ib-hdr"
    nics = gpus_per_node if spec_gpu.nvlink is not None else 1
    return {
        "name": f"{nodes}x{gpus_per_node}:{spec_gpu.name}",
        "node_groups": [
            {
                "name": spec_gpu.name.lower(),
                "count": nodes,
                "gpu": spec_gpu.name,
                "gpus_per_node": gpus_per_node,
                "nics": nics,
            }
        ],
        "fabric": fabric or default_fabric,
        "nodes_per_leaf": 32,
    }


def preset_names() -> list[str]:
    return list(PRESETS)


def preset_spec(name: str) -> dict[str, Any]:
    """The spec document of a named preset or of the `NxG[:MODEL]` shorthand (e.g. `312x8:V100`)."""
    if name in PRESETS:
        return copy.deepcopy(PRESETS[name])
    m = _HOMOGENEOUS.match(name)
    if m:
        return homogeneous(int(m["nodes"]), int(m["gpn"]), m["gpu"] or "H100-SXM")
    raise SpecError(f"unknown cluster {name!r}; presets: {', '.join(PRESETS)}, or NxG[:MODEL] such as 16x8:H100")


def load_preset(name: str) -> Cluster:
    """A named preset, or the `NxG[:MODEL]` shorthand (e.g. `312x8:V100`)."""
    return parse(preset_spec(name))


def resolve(name_or_text: str, read_text: Callable[[str], str] | None = None) -> Cluster:
    """A preset name, `NxG[:MODEL]`, or (given a reader) a path to a YAML spec."""
    if name_or_text in PRESETS or _HOMOGENEOUS.match(name_or_text):
        return load_preset(name_or_text)
    if read_text is not None:
        return parse(read_text(name_or_text))
    return load_preset(name_or_text)
