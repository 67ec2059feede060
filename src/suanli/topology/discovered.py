"""A cluster spec from the nodes a cluster engine reports: Ray nodes and their labels, Slurm nodes and topology.conf.

The engine knows which hosts exist and what they hold; the operator's labels (`suanli.io/leaf`, `suanli.io/spine`,
`suanli.io/nvlink-domain`) or Slurm's switch tree say how they are wired. This turns that into the same spec the
scheduler and the performance model read for every other cluster: hosts in fabric order (spine, leaf, NVLink
domain, name), one node group per run of alike hosts, leaves and spines of the sizes found (`nodes_per_leaf` as a
list). Pure: the caller asks the engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby
from typing import Any


@dataclass(frozen=True)
class Host:
    """One GPU host as discovered. `gpu` is a catalog name; `leaf`, `spine`, `domain` are the engine's labels
    ("" when unlabelled: unlabelled hosts share one leaf, and each is an NVLink domain of its own)."""

    name: str
    gpu: str
    gpus: int
    cpus: int = 0
    memory_mib: int = 0
    leaf: str = ""
    spine: str = ""
    domain: str = ""


def natural(text: str) -> tuple[Any, ...]:
    """`node2` before `node10`."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def fabric_order(hosts: list[Host]) -> list[Host]:
    return sorted(hosts, key=lambda h: (natural(h.spine), natural(h.leaf), natural(h.domain), natural(h.name)))


def _shape(h: Host) -> tuple[str, int, int, int]:
    return (h.gpu, h.gpus, h.cpus, h.memory_mib)


def discovered_spec(
    name: str, hosts: list[Host], fabric: str | dict[str, Any], nics: int = 1, description: str = ""
) -> tuple[dict[str, Any], list[str]]:
    """(the cluster spec, the hosts' names in the spec's node order). Hosts of one labelled NVLink domain must be
    alike (one GPU model and count); that is what an NVLink domain is. Raises ValueError naming the host
    otherwise, or when there are no hosts."""
    if not hosts:
        raise ValueError("no GPU hosts to make a cluster of")
    ordered = fabric_order(hosts)
    groups: list[dict[str, Any]] = []
    runs: list[list[Host]] = []
    for (domain, _), run in groupby(ordered, key=lambda h: (h.domain, (h.spine, h.leaf))):
        members = list(run)
        if domain:  # one NVLink domain spanning these hosts
            if len({_shape(h)[:2] for h in members}) > 1:
                raise ValueError(f"NVLink domain {domain!r}: its hosts differ in GPU model or count "
                                 f"({', '.join(h.name for h in members)})")  # fmt: skip
            runs.append(members)
            continue
        for _, alike in groupby(members, key=_shape):  # unlabelled: each host its own domain
            runs.append(list(alike))
    for i, run in enumerate(runs):
        h = run[0]
        group: dict[str, Any] = {"name": f"g{i}", "count": len(run), "gpu": h.gpu, "gpus_per_node": h.gpus,
                                 "nics": nics, "nvlink_domain_nodes": len(run) if h.domain else 1}  # fmt: skip
        cpus = {x.cpus for x in run}
        mems = {x.memory_mib for x in run}
        if len(cpus) == 1 and h.cpus > 0:
            group["cpus"] = h.cpus
        if len(mems) == 1 and h.memory_mib > 0:
            group["memory_gib"] = h.memory_mib / 1024
        groups.append(group)
    leaves = [len(list(run)) for _, run in groupby(ordered, key=lambda h: (h.spine, h.leaf))]
    leaf_spines = [spine for (spine, _), _ in groupby(ordered, key=lambda h: (h.spine, h.leaf))]
    spines = [len(list(run)) for _, run in groupby(leaf_spines)]
    spec: dict[str, Any] = {"name": name, "description": description, "node_groups": groups, "fabric": fabric,
                            "nodes_per_leaf": leaves, "leaves_per_spine": spines}  # fmt: skip
    return spec, [h.name for h in ordered]
