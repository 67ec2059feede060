"""Small homogeneous clusters for tests."""

from __future__ import annotations

from suanli.topology import Cluster, parse


def homogeneous_cluster(
    gpu: str = "H100-SXM",
    nodes: int = 2,
    gpn: int = 8,
    fabric: str | dict | None = "ib-ndr",
    nics: int = 8,
    **kw: object,
) -> Cluster:
    spec: dict[str, object] = {
        "name": "t",
        "node_groups": [{"name": "n", "count": nodes, "gpu": gpu, "gpus_per_node": gpn, "nics": nics}],
        **kw,
    }
    if fabric is not None:
        spec["fabric"] = fabric
    return parse(spec)
