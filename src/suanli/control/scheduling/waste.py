"""Waste as the scheduler sees it, live: what `sim.metrics` measures over a replay, read off the scheduling
pass's own snapshot so the operator's dashboard and the simulator count the same thing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from suanli.sched import ClusterState, Request


@dataclass(frozen=True)
class LiveWaste:
    """The scheduler's waste, now: GPUs idle while work is queued, and the part of them no queued job can use
    (fragmentation), as `sim.metrics` counts them in a replay."""

    gpus: int = 0  # healthy GPUs on nodes that take work
    idle: int = 0
    fragmented: int = 0
    queued_by_class: tuple[tuple[str, int], ...] = ()

    @property
    def waste_fraction(self) -> float:
        return self.idle / self.gpus if self.gpus and self.queued_by_class else 0.0

    @property
    def fragmentation(self) -> float:
        return self.fragmented / self.gpus if self.gpus and self.queued_by_class else 0.0


def live_waste(states: Mapping[str, ClusterState], placed: Mapping[str, int], left: Sequence[Request]) -> LiveWaste:
    """After a pass: each cluster's idle GPUs less the `placed` ones this pass took (by cluster id), against the
    work `left` waiting. As in a replay, a cluster's idle GPUs all count as fragmented when the smallest job
    still waiting needs more than that."""
    waiting = [r for r in left if r.gpus > 0]
    if not waiting:
        return LiveWaste()
    gpus = idle = frag = 0
    smallest = min(r.min_gpus or r.gpus for r in waiting)
    for cid, st in states.items():
        gpus += int(np.count_nonzero(st.gpu_ok & st.node_ok[st.gpu_node]))
        n = max(0, st.idle_gpus() - placed.get(cid, 0))
        idle += n
        if smallest > n:
            frag += n
    classes = Counter(r.priority for r in waiting)
    return LiveWaste(gpus, idle, frag, tuple(sorted(classes.items())))
