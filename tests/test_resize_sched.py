"""`Scheduler.resize`, the core's entry point for a resize someone asked for: pure, a shrink keeps a subset of the
GPUs held (the same count per node when the node count is fixed), a grow is placed topology-aware or says why not."""

from __future__ import annotations

from dataclasses import replace

from suanli.sched import Allocation, ClusterState, Pending, Request, Resize, Scheduler
from tests.clusters import homogeneous_cluster


def state_with(*allocs: Allocation) -> ClusterState:
    st = ClusterState(homogeneous_cluster(nodes=4, gpn=8))
    for a in allocs:
        st.reserve(a)
    return st


def elastic(rid: str, lo: int = 2, hi: int = 32, nodes: int | None = None) -> Request:
    return Request(rid, lo, 0.0, min_gpus=lo, max_gpus=hi, nodes=nodes)


def test_a_shrink_keeps_gpus_it_holds_on_the_nodes_it_holds_most_of() -> None:
    st = state_with(Allocation("a", elastic("a"), (*range(0, 3), *range(8, 16)), 5.0, est_end=99.0))
    before = (st.free.copy(), dict(st.allocations))
    decision, after = Scheduler().resize(st, "a", 9, "asked")
    assert isinstance(decision, Resize)
    assert decision.gpus == (0, *range(8, 16)) and decision.reason == "asked: 11 → 9"
    assert (st.free == before[0]).all() and st.allocations == before[1]  # the snapshot is untouched
    kept = after.allocations["a"]
    assert kept.gpus == decision.gpus and (kept.start_time, kept.est_end) == (5.0, 99.0)
    assert after.free_whole_gpus() == 32 - 9


def test_a_shrink_with_a_fixed_node_count_keeps_the_same_count_on_each() -> None:
    st = state_with(Allocation("a", elastic("a", 2, 16, nodes=2), (*range(0, 4), *range(8, 12)), 0.0))
    decision, _ = Scheduler().resize(st, "a", 4, "asked")
    assert isinstance(decision, Resize) and decision.gpus == (0, 1, 8, 9)
    decision, _ = Scheduler().resize(st, "a", 3, "asked")
    assert isinstance(decision, Pending) and "do not divide over its 2 nodes" in decision.reason


def test_a_grow_is_placed_compactly_with_a_new_request_or_waits_saying_why() -> None:
    other = Allocation("b", Request("b", 20, 0.0), tuple(range(12, 32)), 0.0)
    st = state_with(Allocation("a", elastic("a"), (0, 1, 2, 3), 0.0), other)
    pinned = replace(elastic("a"), gpus=12, min_gpus=None, max_gpus=None)
    decision, after = Scheduler().resize(st, "a", 12, "asked", pinned)
    assert isinstance(decision, Resize) and decision.gpus == tuple(range(12))
    assert after.allocations["a"].request is pinned and not after.allocations["a"].request.elastic
    decision, after = Scheduler().resize(st, "a", 16, "asked")
    assert isinstance(decision, Pending)
    assert decision.reason == "needs 16 GPUs; 12 free (counting the 4 it holds)"
    assert after.allocations["a"].gpus == (0, 1, 2, 3)
