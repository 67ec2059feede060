"""Scheduling core: placement plugins, policies, one scheduling cycle, and the ClusterState bookkeeping.

Clusters are small (2 leaves x 4 nodes x 8 GPUs and smaller) so every case is cheap; the hypothesis
properties run one cycle per example for every policy over random running allocations and random queues.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from suanli.sched import (
    CLASS_RANK,
    FULL,
    PLACEMENTS,
    POLICIES,
    Allocation,
    ClusterState,
    CycleResult,
    PlacementResult,
    Request,
    Scheduler,
    SchedulerConfig,
    first_fit,
    place_slice,
    topology_aware,
)
from suanli.sched.policies import (
    borrowed,
    est_left,
    higher_las_level,
    lower_class,
    lower_class_or_las,
    lower_class_or_more_left,
)
from suanli.topology import Cluster, parse
from tests.clusters import homogeneous_cluster

# --- helpers -----------------------------------------------------------------------------------------

GPN = 8


def two_leaves() -> Cluster:
    """2 leaves x 4 nodes x 8 H100 (64 GPUs); node n holds GPUs 8n .. 8n+7, leaf = n // 4."""
    return homogeneous_cluster(nodes=8, gpn=GPN, nodes_per_leaf=4)


def two_nodes() -> Cluster:
    """2 nodes x 8 H100 under one leaf (16 GPUs)."""
    return homogeneous_cluster(nodes=2, gpn=GPN)


def hetero() -> Cluster:
    """Two node groups: 2 nodes x 8 H100-SXM (GPUs 0..15), then 3 nodes x 4 A100 (GPUs 16..27)."""
    return parse(
        {
            "name": "het",
            "node_groups": [
                {"name": "h100", "count": 2, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8},
                {"name": "a100", "count": 3, "gpu": "A100-SXM-80G", "gpus_per_node": 4, "nics": 4},
            ],
            "fabric": "ib-ndr",
            "nodes_per_leaf": 2,
        }
    )


def node_gpus(n: int, count: int = GPN, start: int = 0) -> tuple[int, ...]:
    return tuple(range(n * GPN + start, n * GPN + start + count))


def occupy(
    state: ClusterState,
    aid: str,
    gpus: tuple[int, ...] | list[int],
    *,
    milli: int = FULL,
    priority: str = "on-demand",
    tenant: str = "default",
    start: float = 0.0,
    est_runtime: float | None = None,
    attained: float = 0.0,
    min_gpus: int | None = None,
    max_gpus: int | None = None,
    req_gpus: int | None = None,
) -> Allocation:
    """Reserve `gpus` for a running allocation `aid` (its request asks for `req_gpus`, default len(gpus))."""
    n = 1 if milli < FULL else (req_gpus if req_gpus is not None else len(gpus))
    req = Request(
        aid,
        n,
        start,
        tenant=tenant,
        milli=milli,
        priority=priority,  # type: ignore[arg-type]
        est_runtime=est_runtime,
        attained=attained,
        min_gpus=min_gpus,
        max_gpus=max_gpus,
    )
    est_end = start + est_runtime if est_runtime is not None else None
    alloc = Allocation(aid, req, tuple(int(g) for g in gpus), start, milli, est_end)
    state.reserve(alloc)
    return alloc


def nodes_of(state: ClusterState, gpus: np.ndarray | tuple[int, ...]) -> set[int]:
    return {int(n) for n in state.cluster.gpu_node[np.asarray(gpus, dtype=np.int64)]}


def ok(result: PlacementResult) -> np.ndarray:
    assert result.gpus is not None, result.reason
    gpus = np.asarray(result.gpus)
    assert len(set(gpus.tolist())) == gpus.size, "a GPU was handed out twice"
    return gpus


def snapshot_of(state: ClusterState) -> dict:
    return {
        "free": state.free.copy(),
        "gpu_ok": state.gpu_ok.copy(),
        "node_ok": state.node_ok.copy(),
        "node_whole": state.node_whole.copy(),
        "whole_total": state.whole_total,
        "allocations": dict(state.allocations),
    }


def assert_same_state(state: ClusterState, snap: dict) -> None:
    for name in ("free", "gpu_ok", "node_ok", "node_whole"):
        np.testing.assert_array_equal(getattr(state, name), snap[name], err_msg=name)
    assert state.whole_total == snap["whole_total"]
    assert state.allocations == snap["allocations"]


def whole_recount(state: ClusterState) -> tuple[np.ndarray, int]:
    whole = (state.free == FULL) & state.gpu_ok
    per_node = np.bincount(state.cluster.gpu_node[whole], minlength=state.cluster.n_nodes)
    return per_node, int(per_node[state.node_ok & ~state.node_exclusive].sum())  # exclusive nodes take no work


def run(
    policy: str, state: ClusterState, queue: list[Request], now: float, **cfg: object
) -> tuple[CycleResult, ClusterState]:
    return Scheduler(SchedulerConfig(policy=policy, **cfg)).cycle(state, queue, now)  # type: ignore[arg-type]


def pending_reason(result: CycleResult, rid: str) -> str:
    [p] = [p for p in result.pending if p.request_id == rid]
    return p.reason


def placed_ids(result: CycleResult) -> set[str]:
    return {p.request_id for p in result.placed}


# --- placement: topology-aware -----------------------------------------------------------------------


def test_topology_single_node_is_best_fit() -> None:
    s = ClusterState(two_leaves())
    occupy(s, "a", node_gpus(0, 5))  # node 0: 3 free
    occupy(s, "b", node_gpus(1, 3))  # node 1: 5 free
    for k, node in ((1, 0), (3, 0), (4, 1), (5, 1)):
        gpus = ok(topology_aware(s, Request("x", k, 0.0), k))
        assert gpus.size == k
        assert nodes_of(s, gpus) == {node}, (k, gpus)
        assert np.all(s.free[gpus] == FULL)
    # 6..8 need a whole free node; the busier leaf (leaf 0: nodes 2, 3) is preferred
    for k in (6, 8):
        gpus = ok(topology_aware(s, Request("x", k, 0.0), k))
        assert len(nodes_of(s, gpus)) == 1
        assert nodes_of(s, gpus) <= {2, 3}


@pytest.mark.parametrize(
    ("k", "nodes", "leaves"),
    [(1, 1, 1), (8, 1, 1), (12, 2, 1), (16, 2, 1), (24, 3, 1), (32, 4, 1), (40, 5, 2), (48, 6, 2), (64, 8, 2)],
)
def test_topology_multi_node_spans(k: int, nodes: int, leaves: int) -> None:
    c = two_leaves()
    s = ClusterState(c)
    gpus = ok(topology_aware(s, Request("x", k, 0.0), k))
    assert gpus.size == k
    span = c.span(gpus)
    assert span["node"] == nodes
    assert span["leaf"] == leaves


def test_topology_prefers_the_fullest_leaf_that_fits_and_whole_nodes() -> None:
    c = two_leaves()
    s = ClusterState(c)
    occupy(s, "a", node_gpus(0, 4))  # leaf 0: 28 free (4 + 8 + 8 + 8), leaf 1: 32
    gpus = ok(topology_aware(s, Request("x", 16, 0.0), 16))
    assert c.span(gpus)["node"] == 2  # two whole nodes, not the half-used node 0
    assert nodes_of(s, gpus) <= {1, 2, 3}
    # 32 no longer fits in leaf 0: it takes all of leaf 1
    gpus = ok(topology_aware(s, Request("x", 32, 0.0), 32))
    assert nodes_of(s, gpus) == {4, 5, 6, 7}


@pytest.mark.parametrize("placer", [topology_aware, first_fit])
def test_leaf_constraint_too_big_for_a_leaf(placer) -> None:
    s = ClusterState(two_leaves())
    res = placer(s, Request("x", 40, 0.0, topology="leaf"), 40)
    assert res.gpus is None
    assert "leaf" in res.reason
    if placer is topology_aware:
        assert "one leaf" in res.reason
        assert "largest free block" in res.reason
        assert "32" in res.reason


def test_leaf_constraint_reports_the_largest_free_block() -> None:
    s = ClusterState(two_leaves())
    occupy(s, "a", node_gpus(0, 4))
    occupy(s, "b", node_gpus(4, 3))
    res = topology_aware(s, Request("x", 32, 0.0, topology="leaf"), 32)
    assert res.gpus is None
    assert "one leaf" in res.reason and "largest free block is 29" in res.reason
    # a fitting leaf request stays inside one leaf
    gpus = ok(topology_aware(s, Request("x", 28, 0.0, topology="leaf"), 28))
    assert s.cluster.span(gpus)["leaf"] == 1


@pytest.mark.parametrize("placer", [topology_aware, first_fit])
def test_nvlink_constraint(placer) -> None:
    s = ClusterState(two_leaves())
    res = placer(s, Request("x", 16, 0.0, topology="nvlink"), 16)
    assert res.gpus is None
    if placer is topology_aware:
        assert "NVLink" in res.reason
    else:
        assert "nvlink" in res.reason.lower()
    gpus = ok(placer(s, Request("x", 8, 0.0, topology="nvlink"), 8))
    assert len(nodes_of(s, gpus)) == 1


def test_not_enough_free_gpus_has_a_reason() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "a", node_gpus(0))
    for placer in (topology_aware, first_fit):
        res = placer(s, Request("x", 9, 0.0), 9)
        assert res.gpus is None and res.reason


def test_zero_gpus_is_an_empty_placement() -> None:
    s = ClusterState(two_nodes())
    for placer in (topology_aware, first_fit):
        res = placer(s, Request("x", 0, 0.0), 0)
        assert res.gpus is not None and res.gpus.size == 0


@pytest.mark.parametrize("placer", [topology_aware, first_fit])
def test_nodes_gives_exactly_that_many_nodes_with_equal_shares(placer) -> None:
    s = ClusterState(two_leaves())
    occupy(s, "a", node_gpus(0, 5))  # node 0: 3 free (too few for a share of 4)
    occupy(s, "b", node_gpus(1, 3))  # node 1: 5 free
    unconstrained = nodes_of(s, ok(placer(s, Request("x", 8, 0.0), 8)))
    assert unconstrained == ({0, 1} if placer is first_fit else {2})  # node 0's 3 free + node 1's 5, or a whole node
    gpus = ok(placer(s, Request("x", 8, 0.0, nodes=2), 8))
    per_node = np.bincount(s.cluster.gpu_node[gpus], minlength=8)
    assert sorted(per_node[per_node > 0].tolist()) == [4, 4]
    assert per_node[0] == 0 and np.all(s.free[gpus] == FULL)
    assert s.cluster.span(gpus)["leaf"] == 1
    if placer is topology_aware:  # the tightest leaf, its fullest eligible node first
        assert nodes_of(s, gpus) == {1, 2}


@pytest.mark.parametrize("placer", [topology_aware, first_fit])
@pytest.mark.parametrize(
    ("k", "nodes", "topology", "why"),
    [(9, 2, "any", "do not split evenly"), (72, 9, "any", "needs 9 nodes"), (40, 5, "leaf", "leaf")],
)
def test_nodes_that_cannot_be_had_say_why(placer, k: int, nodes: int, topology: str, why: str) -> None:
    s = ClusterState(two_leaves())
    res = placer(s, Request("x", k, 0.0, nodes=nodes, topology=topology), k)
    assert res.gpus is None and why in res.reason, res.reason


@settings(max_examples=60, deadline=None)
@given(
    busy=st.lists(st.integers(0, GPN), min_size=8, max_size=8),
    nodes=st.integers(1, 8),
    per=st.integers(1, GPN),
    topology=st.sampled_from(["any", "leaf"]),
)
def test_nodes_constraint_holds_whenever_it_places(busy: list[int], nodes: int, per: int, topology: str) -> None:
    s = ClusterState(two_leaves())
    for n, used in enumerate(busy):
        if used:
            occupy(s, f"a{n}", node_gpus(n, used))
    eligible = sum(1 for used in busy if GPN - used >= per)
    for placer in (topology_aware, first_fit):
        res = placer(s, Request("x", nodes * per, 0.0, nodes=nodes, topology=topology), nodes * per)
        if res.gpus is None:
            assert res.reason
            if topology == "any":  # only too few eligible nodes can stop it
                assert eligible < nodes
            continue
        gpus = ok(res)
        per_node = np.bincount(s.cluster.gpu_node[gpus], minlength=8)
        assert sorted(per_node[per_node > 0].tolist()) == [per] * nodes
        assert np.all(s.free[gpus] == FULL)
        if topology == "leaf":
            assert s.cluster.span(gpus)["leaf"] == 1


# --- placement: first-fit ----------------------------------------------------------------------------


def test_first_fit_takes_nodes_in_index_order() -> None:
    s = ClusterState(two_leaves())
    occupy(s, "a", node_gpus(0, 5))  # node 0: GPUs 5, 6, 7 free
    occupy(s, "b", node_gpus(1, 7))  # node 1: GPU 15 free
    assert ok(first_fit(s, Request("x", 1, 0.0), 1)).tolist() == [5]  # best fit would take node 1
    assert ok(first_fit(s, Request("x", 2, 0.0), 2)).tolist() == [5, 6]
    assert ok(first_fit(s, Request("x", 4, 0.0), 4)).tolist() == [5, 6, 7, 15]
    assert ok(first_fit(s, Request("x", 12, 0.0), 12)).tolist() == [5, 6, 7, 15, *range(16, 24)]
    # topology-aware instead keeps a 4-GPU gang on one node
    assert len(nodes_of(s, ok(topology_aware(s, Request("x", 4, 0.0), 4)))) == 1


# --- placement: GPU types --------------------------------------------------------------------------------


@pytest.mark.parametrize("placer", [topology_aware, first_fit])
def test_gpu_type_respects_node_groups(placer) -> None:
    c = hetero()
    s = ClusterState(c)
    a100 = set(range(16, 28))
    h100 = set(range(16))
    for k in (1, 4, 6, 12):
        gpus = ok(placer(s, Request("x", k, 0.0, gpu_type="A100-SXM-80G"), k))
        assert gpus.size == k and set(gpus.tolist()) <= a100
    for k in (1, 8, 16):
        gpus = ok(placer(s, Request("x", k, 0.0, gpu_type="H100-SXM"), k))
        assert gpus.size == k and set(gpus.tolist()) <= h100
    assert placer(s, Request("x", 13, 0.0, gpu_type="A100-SXM-80G"), 13).gpus is None
    assert placer(s, Request("x", 17, 0.0, gpu_type="H100-SXM"), 17).gpus is None
    assert ok(placer(s, Request("x", 28, 0.0), 28)).size == 28  # no type: anything
    # A100 pool half used: 6 A100 free, H100 all free
    occupy(s, "a", (16, 17, 18, 19, 20, 21))
    assert placer(s, Request("x", 7, 0.0, gpu_type="A100-SXM-80G"), 7).gpus is None
    gpus = ok(placer(s, Request("x", 6, 0.0, gpu_type="A100-SXM-80G"), 6))
    assert set(gpus.tolist()) == {22, 23, 24, 25, 26, 27}


def test_gpu_type_for_slices_and_in_a_cycle() -> None:
    s = ClusterState(hetero())
    gpus = ok(place_slice(s, Request("x", 1, 0.0, milli=300, gpu_type="A100-SXM-80G")))
    assert gpus.tolist()[0] >= 16
    occupy(s, "a", tuple(range(16, 28)))  # every A100 busy, every H100 free
    res, _ = run("default", s, [Request("q", 2, 0.0, gpu_type="A100-SXM-80G")], 10.0)
    assert not res.placed
    assert "A100" in pending_reason(res, "q")


# --- placement: slices -----------------------------------------------------------------------------------


@pytest.mark.parametrize("placer", [topology_aware, place_slice])
def test_slices_pack_best_fit_before_breaking_a_whole_gpu(placer) -> None:
    c = two_leaves()
    s = ClusterState(c)

    def put(aid: str, milli: int) -> int:
        req = Request(aid, 1, 0.0, milli=milli)
        gpus = ok(placer(s, req, 1) if placer is topology_aware else placer(s, req))
        assert gpus.size == 1
        occupy(s, aid, gpus.tolist(), milli=milli)
        return int(gpus[0])

    whole0 = s.free_whole_gpus()
    g0 = put("s1", 500)
    assert s.free_whole_gpus() == whole0 - 1
    assert put("s2", 300) == g0  # shares g0 (200 left) instead of breaking a whole GPU
    assert s.free_whole_gpus() == whole0 - 1
    g1 = put("s3", 300)  # does not fit on g0: breaks one more whole GPU ...
    assert g1 != g0 and s.free_whole_gpus() == whole0 - 2
    assert s.cluster.gpu_node[g1] == s.cluster.gpu_node[g0]  # ... on the node already broken into
    assert put("s4", 200) == g0  # best fit: g0 (0 left) rather than g1 (500 left)
    assert s.free[g0] == 0
    assert put("s5", 500) == g1  # 700 free on g1: tighter than a whole GPU
    assert s.free_whole_gpus() == whole0 - 2


def test_slice_best_fit_picks_the_tightest_shared_gpu() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "a", [3], milli=400)  # GPU 3: 600 free
    occupy(s, "b", [9], milli=600)  # GPU 9: 400 free
    assert ok(place_slice(s, Request("x", 1, 0.0, milli=400))).tolist() == [9]
    assert ok(place_slice(s, Request("x", 1, 0.0, milli=500))).tolist() == [3]
    g = int(ok(place_slice(s, Request("x", 1, 0.0, milli=700)))[0])
    assert g not in (3, 9) and s.free[g] == FULL
    # first fit takes the lowest index that has room
    assert ok(place_slice(s, Request("x", 1, 0.0, milli=300), best_fit=False)).tolist() == [0]
    assert ok(first_fit(s, Request("x", 1, 0.0, milli=500), 1)).tolist() == [0]


def test_whole_gpu_gangs_skip_shared_gpus() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "a", [2], milli=100)
    assert nodes_of(s, ok(topology_aware(s, Request("x", 8, 0.0), 8))) == {1}
    for placer in (topology_aware, first_fit):
        assert 2 not in ok(placer(s, Request("x", 8, 0.0), 8)).tolist()
        gpus = ok(placer(s, Request("x", 15, 0.0), 15))
        assert 2 not in gpus.tolist()
        assert placer(s, Request("x", 16, 0.0), 16).gpus is None


def test_slices_in_one_cycle_share_one_gpu() -> None:
    s = ClusterState(two_nodes())
    queue = [Request(f"s{i}", 1, float(i), milli=250) for i in range(4)]
    res, new = run("default", s, queue, 10.0)
    assert placed_ids(res) == {"s0", "s1", "s2", "s3"}
    assert len({p.gpus for p in res.placed}) == 1
    assert all(p.milli == 250 for p in res.placed)
    assert new.free_whole_gpus() == 15


# --- placement: exclusive ------------------------------------------------------------------------------


@pytest.mark.parametrize("placer", [topology_aware, first_fit])
def test_exclusive_gets_whole_free_nodes_only(placer) -> None:
    s = ClusterState(two_leaves())
    occupy(s, "a", [0])  # node 0 has 7 free GPUs but is not empty
    occupy(s, "b", [12], milli=200)  # node 1 has a shared GPU
    for k in (1, 4, 8, 16, 24):
        gpus = ok(placer(s, Request("x", k, 0.0, exclusive=True), k))
        assert gpus.size == k
        assert not nodes_of(s, gpus) & {0, 1}, (k, gpus)
        for n in nodes_of(s, gpus):
            assert s.node_whole[n] == GPN  # every node it touches was entirely free
    assert ok(placer(s, Request("x", 16, 0.0, exclusive=True), 16)).size == 16
    assert len(nodes_of(s, ok(placer(s, Request("x", 16, 0.0, exclusive=True), 16)))) == 2
    # six empty nodes: 48 fits, 49 does not (non-exclusive 49 would)
    assert ok(placer(s, Request("x", 48, 0.0, exclusive=True), 48)).size == 48
    assert placer(s, Request("x", 49, 0.0, exclusive=True), 49).gpus is None
    assert ok(placer(s, Request("x", 49, 0.0), 49)).size == 49


def test_exclusive_placement_made_by_preemption_does_not_share_its_node() -> None:
    """Node 0 holds two spot jobs (GPUs 0-3, 4-7), node 1 an on-demand job; an exclusive 1-GPU on-demand
    request preempts. The statement frees s2 (node 0 still not empty), then s1 (node 0 empty), places on
    GPU 0 — and then gives s2 back because GPU 0 is not one of s2's GPUs: the exclusive job shares node 0.
    """
    s = ClusterState(two_nodes())
    occupy(s, "s1", (0, 1, 2, 3), priority="spot", start=0.0)
    occupy(s, "s2", (4, 5, 6, 7), priority="spot", start=50.0)
    occupy(s, "od", node_gpus(1))
    res, new = run("priority", s, [Request("x", 1, 60.0, exclusive=True)], 100.0)
    [place] = res.placed
    mine = nodes_of(s, place.gpus)
    others = [a.id for a in new.allocations.values() if a.id != "x" and nodes_of(s, a.gpus) & mine]
    assert not others, f"exclusive x on node {mine} shares it with {others}"


# --- ClusterState ------------------------------------------------------------------------------------------


def test_reserve_unreserve_round_trip() -> None:
    s = ClusterState(two_leaves())
    occupy(s, "base", node_gpus(3, 2))
    before = snapshot_of(s)
    a = occupy(s, "a", (0, 1, 2, 9, 40))
    b = occupy(s, "b", [5], milli=300)
    c = occupy(s, "c", [5], milli=700)
    assert s.free[5] == 0
    assert s.free_whole_gpus() == before["whole_total"] - 6
    assert s.allocated_gpus() == pytest.approx(2 + 5 + 1)
    assert set(s.holders([5])) == {"b", "c"}
    assert s.holders([63]) == []
    assert s.unreserve("c") is c
    assert s.unreserve("a") is a
    assert s.unreserve("b") is b
    assert_same_state(s, before)


def test_reserve_refuses_busy_unhealthy_or_duplicate() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "a", (0, 1))
    occupy(s, "half", [4], milli=600)
    before = snapshot_of(s)
    with pytest.raises(ValueError):
        occupy(s, "b", (1, 2))  # GPU 1 is busy
    with pytest.raises(ValueError):
        occupy(s, "c", [4])  # a whole GPU on a shared one
    with pytest.raises(ValueError):
        occupy(s, "d", [4], milli=500)  # only 400 left
    with pytest.raises(ValueError):
        occupy(s, "a", (8, 9))  # the id already holds GPUs
    assert_same_state(s, before)
    s.set_gpu_ok(10, False)
    with pytest.raises(ValueError):
        occupy(s, "e", (10,))
    occupy(s, "f", [4], milli=400)
    assert s.free[4] == 0


def test_drained_node_is_not_used() -> None:
    c = two_leaves()
    s = ClusterState(c)
    occupy(s, "a", node_gpus(2, 3))  # node 2: 5 free, the best fit for 5
    total = s.free_whole_gpus()
    s.set_node_ok(2, False)
    assert s.free_whole_gpus() == total - 5
    s.set_node_ok(2, False)  # idempotent
    assert s.free_whole_gpus() == total - 5
    for placer in (topology_aware, first_fit):
        for k in (1, 5, 8, 16, 32, 56):
            gpus = ok(placer(s, Request("x", k, 0.0), k))
            assert 2 not in nodes_of(s, gpus), (placer.__name__, k)
        assert placer(s, Request("x", 57, 0.0), 57).gpus is None
    for best in (True, False):
        g = ok(place_slice(s, Request("x", 1, 0.0, milli=100), best_fit=best))
        assert 2 not in nodes_of(s, g)
    res, _ = run("default", s, [Request("q", 5, 0.0)], 1.0)
    assert 2 not in nodes_of(s, res.placed[0].gpus)
    # work finishing on a drained node does not make it usable; returning the node does
    s.unreserve("a")
    assert s.free_whole_gpus() == total - 5
    s.set_node_ok(2, True)
    assert s.free_whole_gpus() == total + 3
    assert s.free_whole_gpus() == whole_recount(s)[1]


def test_unhealthy_gpu_is_not_used() -> None:
    s = ClusterState(two_nodes())
    s.set_gpu_ok(3, False)
    assert s.free_whole_gpus() == 15
    for placer in (topology_aware, first_fit):
        assert 3 not in ok(placer(s, Request("x", 15, 0.0), 15)).tolist()
        assert placer(s, Request("x", 16, 0.0), 16).gpus is None
    assert ok(first_fit(s, Request("x", 1, 0.0, milli=10), 1)).tolist() == [0]
    occupy(s, "a", (0, 1, 2))
    assert ok(place_slice(s, Request("x", 1, 0.0, milli=10), best_fit=False)).tolist() == [4]


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(1, 12), st.sampled_from([FULL, FULL, 250, 500, 900])),
        st.tuples(st.just("unreserve"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("node"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("gpu"), st.integers(0, 31), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(ops=_OPS)
def test_incremental_counts_match_a_recount(ops: list[tuple[str, int, object]]) -> None:
    """node_whole / whole_total are kept incrementally; any sequence of operations agrees with a recount."""
    s = ClusterState(homogeneous_cluster(nodes=4, gpn=GPN, nodes_per_leaf=2))
    fresh = snapshot_of(ClusterState(s.cluster))
    n = 0
    for op, a, b in ops:
        if op == "reserve":
            milli = int(b)  # type: ignore[arg-type]
            k = 1 if milli < FULL else a
            req = Request(f"a{n}", k, 0.0, milli=milli)
            res = first_fit(s, req, k)
            if res.gpus is not None:
                s.reserve(Allocation(req.id, req, tuple(int(g) for g in res.gpus), 0.0, milli))
                n += 1
        elif op == "unreserve" and s.allocations:
            ids = sorted(s.allocations)
            s.unreserve(ids[a % len(ids)])
        elif op == "node":
            s.set_node_ok(a, bool(b))
        elif op == "gpu":
            s.set_gpu_ok(a, bool(b))
        per_node, total = whole_recount(s)
        np.testing.assert_array_equal(s.node_whole, per_node)
        assert s.free_whole_gpus() == total
        assert np.all((s.free >= 0) & (s.free <= FULL))
    for aid in list(s.allocations):
        s.unreserve(aid)
    for node in range(s.cluster.n_nodes):
        s.set_node_ok(node, True)
    for g in range(s.n_gpus):
        s.set_gpu_ok(g, True)
    assert_same_state(s, fresh)


# --- Scheduler: names ---------------------------------------------------------------------------------


def test_unknown_policy_or_placement_lists_known_names() -> None:
    with pytest.raises(ValueError, match="unknown policy") as e:
        Scheduler(SchedulerConfig(policy="round-robin"))
    for name in POLICIES:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="unknown placement") as e:
        Scheduler(SchedulerConfig(policy="fifo", placement="random"))
    for name in PLACEMENTS:
        assert name in str(e.value)
    for name in PLACEMENTS:
        Scheduler(SchedulerConfig(policy="fifo", placement=name))


# --- Scheduler: fifo and EASY backfill ----------------------------------------------------------------------


def _blocked_head_cluster() -> ClusterState:
    """16 GPUs; a job holds 12 (node 0 and half of node 1) until t=1000; 4 are free."""
    s = ClusterState(two_nodes())
    occupy(s, "running", (*node_gpus(0), *node_gpus(1, 4)), est_runtime=1000.0)
    return s


def _head_short_long() -> list[Request]:
    return [
        Request("head", 16, 10.0, est_runtime=3600.0),
        Request("short", 2, 20.0, est_runtime=500.0),  # 100 + 500 <= 1000
        Request("long", 2, 30.0, est_runtime=5000.0),
        Request("unknown", 2, 40.0),  # no estimate
    ]


def test_fifo_blocks_behind_the_head() -> None:
    s = _blocked_head_cluster()
    res, new = run("fifo", s, _head_short_long(), 100.0)
    assert not res.placed and not res.preempted
    assert [p.request_id for p in res.pending] == ["head", "short", "long", "unknown"]
    assert [p.position for p in res.pending] == [0, 1, 2, 3]
    assert "16" in pending_reason(res, "head")
    for rid in ("short", "long", "unknown"):
        assert "waits behind" in pending_reason(res, rid)
        assert "head" in pending_reason(res, rid)
    assert new.allocations.keys() == {"running"}


def test_fifo_backfill_lets_short_work_past_a_blocked_head() -> None:
    s = _blocked_head_cluster()
    snap = snapshot_of(s)
    res, new = run("fifo-backfill", s, _head_short_long(), 100.0)
    assert placed_ids(res) == {"short"}
    assert new.allocations["short"].est_end == pytest.approx(600.0)
    for rid in ("long", "unknown"):
        assert "reservation" in pending_reason(res, rid)
        assert "head" in pending_reason(res, rid)
    assert "reservation" not in pending_reason(res, "head")
    assert_same_state(s, snap)


def test_fifo_backfill_spare_gpus_beyond_the_reservation() -> None:
    """The head needs 14 of the 16 GPUs free at t=1000: 2 spare GPUs may go to long work, not more."""
    s = _blocked_head_cluster()
    queue = [
        Request("head", 14, 10.0),
        Request("long", 2, 20.0, est_runtime=5000.0),
        Request("long2", 2, 30.0, est_runtime=5000.0),
    ]
    res, _ = run("fifo-backfill", s, queue, 100.0)
    assert placed_ids(res) == {"long"}
    assert "reservation" in pending_reason(res, "long2")


def test_default_reserves_for_starving_work_only() -> None:
    queue = _head_short_long()
    # fresh head: greedy, everything that fits runs
    res, _ = run("default", _blocked_head_cluster(), queue, 100.0)
    assert placed_ids(res) == {"short", "long"}  # 4 free GPUs, 2 + 2
    # a head waiting over starvation_s gets an EASY reservation
    res, _ = run("default", _blocked_head_cluster(), queue, 100.0, starvation_s=50.0)
    assert placed_ids(res) == {"short"}
    assert "reservation" in pending_reason(res, "long")
    # the same head put back in the queue 30 s ago (preempted: it had service) is not starving yet
    queue = [replace(r, queued_since=70.0) if r.id == "head" else r for r in queue]
    res, _ = run("default", _blocked_head_cluster(), queue, 100.0, starvation_s=50.0)
    assert placed_ids(res) == {"short", "long"}


# --- Scheduler: priority ---------------------------------------------------------------------------------


def _full_of(priority: str, tenant: str = "default") -> ClusterState:
    s = ClusterState(two_nodes())
    occupy(s, "old", node_gpus(0), priority=priority, tenant=tenant, start=0.0)
    occupy(s, "new", node_gpus(1), priority=priority, tenant=tenant, start=50.0)
    return s


def test_priority_preempts_spot_for_on_demand() -> None:
    s = _full_of("spot")
    snap = snapshot_of(s)
    res, new = run("priority", s, [Request("od", 8, 60.0, priority="on-demand")], 100.0)
    assert [p.allocation_id for p in res.preempted] == ["new"]  # the most recently started
    assert res.preempted[0].reason
    [place] = res.placed
    assert place.request_id == "od" and set(place.gpus) == set(node_gpus(1))
    assert set(new.allocations) == {"old", "od"}
    assert_same_state(s, snap)
    # a 16-GPU on-demand job evicts both
    res, new = run("priority", s, [Request("big", 16, 60.0)], 100.0)
    assert {p.allocation_id for p in res.preempted} == {"old", "new"}
    assert set(new.allocations) == {"big"}


@pytest.mark.parametrize(
    ("holder", "claimant"),
    [("on-demand", "on-demand"), ("reserved", "on-demand"), ("spot", "spot"), ("reserved", "reserved")],
)
def test_priority_never_preempts_same_or_higher_class(holder: str, claimant: str) -> None:
    s = _full_of(holder)
    res, new = run("priority", s, [Request("q", 8, 60.0, priority=claimant)], 100.0)  # type: ignore[arg-type]
    assert not res.preempted and not res.placed
    assert pending_reason(res, "q")
    assert set(new.allocations) == {"old", "new"}


def test_priority_reserved_preempts_on_demand_and_orders_by_class() -> None:
    s = _full_of("on-demand")
    queue = [
        Request("spot", 8, 1.0, priority="spot"),
        Request("od", 8, 2.0, priority="on-demand"),
        Request("res", 8, 3.0, priority="reserved"),
    ]
    res, _ = run("priority", s, queue, 100.0)
    assert placed_ids(res) == {"res"}
    assert len(res.preempted) == 1
    positions = {p.request_id: p.position for p in res.pending}
    assert positions == {"od": 1, "spot": 2}


# --- Scheduler: LAS ----------------------------------------------------------------------------------------


LAS_CFG = {"las_thresholds": (3_600.0, 36_000.0), "min_runtime_s": 600.0}


def _las_state(attained: float = 0.0, priority: str = "on-demand") -> ClusterState:
    s = ClusterState(two_nodes())
    occupy(s, "v", tuple(range(16)), start=0.0, attained=attained, priority=priority)
    return s


def test_las_preempts_a_long_running_job_only_after_min_runtime() -> None:
    # at t=300 the victim attained 300 * 16 = 4800 GPU-s (level 1) but ran less than 600 s
    cfg = {**LAS_CFG, "preempt_collateral": 8.0}  # allow a 16-GPU victim for a 4-GPU request
    res, _ = run("las", _las_state(), [Request("n", 4, 250.0)], 300.0, **cfg)
    assert not res.preempted and not res.placed
    res, new = run("las", _las_state(), [Request("n", 4, 250.0)], 700.0, **cfg)
    assert [p.allocation_id for p in res.preempted] == ["v"]
    assert placed_ids(res) == {"n"}
    assert set(new.allocations) == {"n"}


def test_las_does_not_preempt_the_same_level_or_a_higher_class() -> None:
    # the newcomer has attained as much: same level
    res, _ = run("las", _las_state(), [Request("n", 4, 250.0, attained=10_000.0)], 700.0, **LAS_CFG)
    assert not res.preempted
    # a reserved job is not preempted by an on-demand newcomer, whatever its level
    res, _ = run("las", _las_state(priority="reserved"), [Request("n", 4, 250.0)], 100_000.0, **LAS_CFG)
    assert not res.preempted


def test_las_orders_by_attained_service() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "x", tuple(range(12)), start=900.0)  # ran 100 s: not preemptible yet
    queue = [Request("old-heavy", 4, 0.0, attained=50_000.0), Request("new-light", 4, 500.0)]
    res, _ = run("las", s, queue, 1000.0, **LAS_CFG)
    assert placed_ids(res) == {"new-light"}
    assert pending_reason(res, "old-heavy")


# --- Scheduler: fair-share ------------------------------------------------------------------------------


def test_fair_share_puts_a_below_quota_tenant_first() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "a-run", tuple(range(12)), tenant="A")
    queue = [Request("a1", 4, 0.0, tenant="A"), Request("b1", 4, 10.0, tenant="B")]
    for cfg in ({"quotas": {"A": 8.0, "B": 8.0}}, {}):  # with quotas, and by DRF share alone
        res, _ = run("fair-share", s, queue, 100.0, **cfg)
        assert placed_ids(res) == {"b1"}, cfg
        assert [(p.request_id, p.position) for p in res.pending] == [("a1", 1)]
        assert not res.preempted


def test_fair_share_reclaims_borrowed_gpus() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "a0", node_gpus(0), tenant="A", start=0.0)
    occupy(s, "a1", node_gpus(1), tenant="A", start=10.0)
    res, _ = run("fair-share", s, [Request("b", 8, 20.0, tenant="B")], 100.0, quotas={"A": 8.0, "B": 8.0})
    assert [p.allocation_id for p in res.preempted] == ["a1"]
    assert placed_ids(res) == {"b"}
    # A at its quota (8 of 8): nothing is borrowed, nothing reclaimed
    res, _ = run("fair-share", s, [Request("b", 8, 20.0, tenant="B")], 100.0, quotas={"A": 16.0, "B": 8.0})
    assert not res.preempted and not res.placed


def test_fair_share_stops_reclaiming_once_the_victim_is_back_at_quota() -> None:
    """A (quota 10) holds 4 x 4 = 16 GPUs, 6 of them borrowed; B (quota 16) asks for 12.

    Evicting A's allocations one by one: 16 → 12 (A still borrows) → 8 (A is now below its quota).
    The borrowed rule may not evict a third allocation from A, which is below its quota by then.
    """
    s = ClusterState(two_nodes())
    for i in range(4):
        occupy(s, f"a{i}", tuple(range(4 * i, 4 * i + 4)), tenant="A", start=float(i))
    res, new = run("fair-share", s, [Request("b", 12, 5.0, tenant="B")], 100.0, quotas={"A": 10.0, "B": 16.0})
    usage = 16.0
    for p in res.preempted:
        assert usage > 10.0, f"{p.allocation_id} preempted while A holds {usage} GPUs, below its quota of 10"
        usage -= 4.0
    a_left = sum(a.gpu_count for a in new.allocations.values() if a.request.tenant == "A")
    assert a_left >= 8


# --- Scheduler: elastic ----------------------------------------------------------------------------------


def test_elastic_grows_into_idle_gpus_and_shrinks_for_waiting_work() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "e", (0, 1, 2, 3), min_gpus=1, max_gpus=16, start=0.0)
    snap = snapshot_of(s)
    res, grown = run("elastic", s, [], 10.0)
    assert_same_state(s, snap)
    [rz] = res.resized
    assert rz.allocation_id == "e" and len(rz.gpus) == 16 and rz.reason
    assert grown.allocations["e"].gpus == rz.gpus
    assert grown.free_whole_gpus() == 0
    # nothing to grow into: no decision
    res, _ = run("elastic", grown, [], 20.0)
    assert not res.resized
    # work waits: the grown job gives back what it took beyond its request, and the waiting job starts
    # in the same cycle
    res, shrunk = run("elastic", grown, [Request("w", 4, 20.0)], 30.0)
    [rz] = res.resized
    assert rz.allocation_id == "e" and len(rz.gpus) == 4
    assert placed_ids(res) == {"w"}
    assert shrunk.free_whole_gpus() == 8
    # nothing waits again: it may grow back into the idle GPUs
    res, after = run("elastic", shrunk, [], 40.0)
    assert 4 <= after.allocations["e"].gpu_count <= 12


def test_elastic_grows_partially_when_its_maximum_does_not_fit() -> None:
    """16 GPUs: another job holds 4, the elastic job (max 16) holds 4, 8 are idle and nothing waits.

    It should grow to 12 (4 + the 8 idle). The grow step unreserves the job first and then asks for
    min(max, held + free) = min(16, 4 + 12) = 16: its own GPUs are counted twice, so the request for 16
    fails and it does not grow at all (it only ever grows when it can reach max_gpus in one step).
    """
    s = ClusterState(two_nodes())
    occupy(s, "other", (4, 5, 6, 7))
    occupy(s, "e", (0, 1, 2, 3), min_gpus=1, max_gpus=16, start=0.0)
    res, new = run("elastic", s, [], 10.0)
    assert [r.allocation_id for r in res.resized] == ["e"], "an elastic job did not grow into 8 idle GPUs"
    assert len(res.resized[0].gpus) == 12
    assert new.free_whole_gpus() == 0


def test_elastic_request_placed_and_grown_in_one_cycle_is_one_place() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "busy", (0, 1, 2, 3, 4, 5))
    res, new = run("elastic", s, [Request("e", 4, 0.0, min_gpus=2, max_gpus=8)], 10.0)
    [place] = res.placed
    assert not res.resized  # not a resize of something that did not run before this cycle
    assert new.allocations["e"].gpus == place.gpus
    assert 2 <= len(place.gpus) <= 8


def test_elastic_request_falls_back_to_its_minimum() -> None:
    s = ClusterState(two_nodes())
    occupy(s, "busy", tuple(range(13)))
    res, new = run("elastic", s, [Request("e", 8, 0.0, min_gpus=2, max_gpus=8), Request("w", 16, 1.0)], 10.0)
    [place] = res.placed
    assert place.request_id == "e" and len(place.gpus) == 2  # min, and no growth: w waits
    assert new.allocations["e"].gpu_count == 2


# --- Scheduler: purity --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(POLICIES))
def test_cycle_does_not_mutate_its_input(name: str) -> None:
    s = ClusterState(two_leaves())
    occupy(s, "spot", node_gpus(0), priority="spot", start=0.0, est_runtime=5000.0)
    occupy(s, "el", node_gpus(1, 4), min_gpus=1, max_gpus=16, start=0.0, attained=1e6)
    occupy(s, "sl", [20], milli=300, tenant="t1")
    s.set_node_ok(7, False)
    snap = snapshot_of(s)
    queue = [
        Request("a", 40, 0.0, priority="reserved"),
        Request("b", 8, 1.0),
        Request("c", 1, 2.0, milli=500),
        Request("d", 64, 3.0),
        Request("e", 4, 4.0, min_gpus=1, max_gpus=12),
    ]
    res, new = Scheduler(SchedulerConfig(policy=name)).cycle(s, queue, 10_000.0)
    assert_same_state(s, snap)
    assert new is not s
    seen = placed_ids(res) | {p.request_id for p in res.pending}
    assert seen == {r.id for r in queue}
    assert "d" not in placed_ids(res)


# --- hypothesis: one cycle over random running work and random queues ---------------------------------------

H100, A100 = "H100-SXM", "A100-SXM-80G"
PROP_CLUSTER = parse(
    {
        "name": "prop",
        "node_groups": [
            {"name": "h100", "count": 2, "gpu": H100, "gpus_per_node": 8, "nics": 8},
            {"name": "a100", "count": 2, "gpu": A100, "gpus_per_node": 8, "nics": 8},
        ],
        "fabric": "ib-ndr",
        "nodes_per_leaf": 2,
    }
)
NOW = 20_000.0
TENANTS = ("t0", "t1", "t2")
QUOTAS = {"t0": 8.0, "t1": 12.0}  # t2 has none
PRIORITIES = ("spot", "on-demand", "reserved")
# Failing examples are reported as generated: shrinking a whole-cycle scenario costs tens of seconds.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


@dataclass
class Scenario:
    state: ClusterState
    queue: list[Request]
    down_node: int | None


@st.composite
def requests(draw: st.DrawFn, rid: str, max_gpus: int, running: bool) -> Request:
    kind = draw(st.sampled_from(["whole", "whole", "whole", "slice", "elastic"]))
    g = draw(st.integers(1, max_gpus))
    common = {
        "tenant": draw(st.sampled_from(TENANTS)),
        "priority": draw(st.sampled_from(PRIORITIES)),
        "attained": draw(st.sampled_from([0.0, 1_000.0, 5_000.0, 50_000.0, 500_000.0])),
        "est_runtime": draw(st.one_of(st.none(), st.floats(10.0, 20_000.0))),
        "submit_time": draw(st.floats(0.0, NOW)),
    }
    if not running:
        common["gpu_type"] = draw(st.sampled_from([None, None, H100, A100]))
    if kind == "slice":
        return Request(rid, 1, milli=draw(st.integers(50, 950)), **common)
    if kind == "elastic":
        lo = draw(st.integers(1, g))
        hi = draw(st.integers(g, min(32, g + 8) if running else 32))
        return Request(rid, g, min_gpus=lo, max_gpus=hi, **common)
    topology = "any" if running else draw(st.sampled_from(["any", "any", "any", "leaf", "nvlink"]))
    exclusive = (not running) and draw(st.integers(0, 3)) == 0
    return Request(rid, g, topology=topology, exclusive=exclusive, **common)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    state = ClusterState(PROP_CLUSTER)
    for i in range(draw(st.integers(0, 8))):
        req = draw(requests(f"r{i}", 12, running=True))
        held = draw(st.integers(req.gpus, req.max_gpus)) if req.elastic and req.max_gpus else req.gpus
        res = first_fit(state, req, held)  # an elastic job may run grown beyond its request
        if res.gpus is None:
            continue
        start = draw(st.floats(0.0, NOW))
        est_end = start + req.est_runtime if req.est_runtime is not None else None
        state.reserve(Allocation(req.id, req, tuple(int(g) for g in res.gpus), start, req.milli, est_end))
    down = draw(st.one_of(st.none(), st.integers(0, 3)))
    if down is not None:
        state.set_node_ok(down, False)
    bad = draw(st.one_of(st.none(), st.integers(0, PROP_CLUSTER.n_gpus - 1)))
    if bad is not None and state.free[bad] == FULL:
        state.set_gpu_ok(bad, False)
    queue = [draw(requests(f"q{i}", 32, running=False)) for i in range(draw(st.integers(0, 10)))]
    return Scenario(state, queue, down)


def explicit(running: list[tuple[Request, range | tuple[int, ...], float]], queue: list[Request]) -> Scenario:
    """A scenario written out: (request, its GPUs, start) running on PROP_CLUSTER, and the queue."""
    state = ClusterState(PROP_CLUSTER)
    for req, gpus, start in running:
        est_end = start + req.est_runtime if req.est_runtime is not None else None
        state.reserve(Allocation(req.id, req, tuple(gpus), start, req.milli, est_end))
    return Scenario(state, queue, None)


# Found by a 1,500-example search (they failed "shrink only when something waits"). The grown job r5 gives back two
# GPUs, and the blocked slice q2 and then q1 start on them: nothing waits after the cycle, rightly.
SHRINK_THEN_ALL_PLACED = explicit(
    [
        (Request("r0", 1, 11474.0, "t1", priority="reserved", est_runtime=4847.0, attained=50_000.0), (0,), 9783.0),
        (Request("r1", 12, 16241.0, "t1", priority="reserved", est_runtime=2838.0, attained=1000.0), range(1, 13), 0.0),
        (Request("r2", 1, 5676.0, "t0", milli=512, attained=1000.0), (13,), 8024.0),
        (Request("r3", 4, 11809.0, "t2", attained=1000.0), range(14, 18), 4990.0),
        (Request("r4", 1, 18205.0, "t1", milli=196, priority="spot", attained=1000.0), (13,), 11330.0),
        (Request("r5", 12, 17245.0, "t2", min_gpus=12, max_gpus=14, est_runtime=16646.0), range(18, 32), 505.0),
    ],
    [
        Request("q0", 1, 5676.0, "t0", milli=50, priority="reserved", attained=1000.0),
        Request("q1", 1, 9880.0, "t0", priority="spot", attained=1000.0),
        Request("q2", 1, 10968.0, "t1", milli=894),
    ],
)
# The exclusive q0 needs a whole H100 node: r2 shrinking (moved to A100s) frees node 1. The policy used to shrink every
# grown job, r0 too, whose GPUs then sat idle while nothing waited; now r0 keeps them.
SHRINK_ONLY_WHAT_IS_NEEDED = explicit(
    [
        (Request("r0", 3, 6231.0, "t2", min_gpus=2, max_gpus=9, priority="spot", attained=5000.0), range(6), 0.0),
        (Request("r1", 1, 4494.0, "t0", milli=256), (6,), 0.0),
        (Request("r2", 6, 15394.0, "t1", min_gpus=3, max_gpus=11, attained=5000.0), range(7, 16), 282.0),
        (Request("r3", 1, 5088.0, "t0", milli=126, priority="reserved", attained=5000.0), (6,), 3937.0),
        (Request("r4", 6, 0.0, "t0", min_gpus=1, max_gpus=6, attained=5000.0), range(16, 22), 0.0),
        (Request("r5", 2, 0.0, "t0"), (22, 23), 0.0),
        (Request("r6", 1, 0.0, "t2", priority="spot", attained=5000.0), (24,), 0.0),
    ],
    [Request("q0", 1, 0.0, "t0", gpu_type=H100, exclusive=True)],
)


def _las_level(attained: float, thresholds: tuple[float, ...]) -> int:
    return bisect_right(thresholds, attained)


def _victim_level(v: Allocation, now: float, thresholds: tuple[float, ...]) -> int:
    return _las_level(v.request.attained + (now - v.start_time) * v.gpu_count, thresholds)


def check_cycle(
    name: str, cfg: SchedulerConfig, sc: Scenario, result: CycleResult, new: ClusterState, now: float = NOW
) -> None:
    old = sc.state
    c = old.cluster
    queue = {r.id: r for r in sc.queue}
    placed = {p.request_id: p for p in result.placed}
    pending = {p.request_id: p for p in result.pending}
    preempted = [p.allocation_id for p in result.preempted]
    resized = {r.allocation_id: r for r in result.resized}

    # every queued request: exactly one of placed / pending; pending has a reason and a position
    assert len(placed) == len(result.placed) and len(pending) == len(result.pending)
    assert placed.keys() | pending.keys() == queue.keys()
    assert not placed.keys() & pending.keys()
    for p in result.pending:
        assert p.reason, p
        assert 0 <= p.position < len(queue)
    assert len({p.position for p in result.pending}) == len(result.pending)

    # capacity: free milli in 0..1000; per GPU, held milli == 1000 - free; whole GPUs are not shared
    assert np.all((new.free >= 0) & (new.free <= FULL))
    held = np.zeros(c.n_gpus, dtype=np.int64)
    holders: dict[int, list[Allocation]] = {}
    for a in new.allocations.values():
        assert len(set(a.gpus)) == len(a.gpus), a
        for g in a.gpus:
            held[g] += a.milli
            holders.setdefault(g, []).append(a)
    np.testing.assert_array_equal(held, FULL - new.free)
    for g, hs in holders.items():
        if any(a.milli == FULL for a in hs):
            assert len(hs) == 1, f"GPU {g} shared by a whole-GPU allocation: {[a.id for a in hs]}"
    healthy = new.gpu_ok
    total = sum(a.milli * sum(1 for g in a.gpus if healthy[g]) for a in new.allocations.values())
    assert total == FULL * int(healthy.sum()) - int(new.free[healthy].sum())
    per_node, whole = whole_recount(new)
    np.testing.assert_array_equal(new.node_whole, per_node)
    assert new.free_whole_gpus() == whole

    # the new state is the old one, less the preempted, plus the placed, with the resizes applied
    assert len(set(preempted)) == len(preempted)
    assert set(preempted) <= old.allocations.keys(), "preempted something that was not running before the cycle"
    assert set(resized) <= old.allocations.keys(), "resized something that was not running before the cycle"
    assert not set(resized) & set(preempted)
    assert new.allocations.keys() == (old.allocations.keys() - set(preempted)) | placed.keys()
    for aid, a in new.allocations.items():
        if aid in placed:
            assert a.gpus == placed[aid].gpus and a.milli == placed[aid].milli
        elif aid in resized:
            assert a.gpus == resized[aid].gpus
        else:
            assert a == old.allocations[aid]

    # each placement: all or nothing, on usable GPUs of the right type, within its topology constraint
    for rid, p in placed.items():
        r = queue[rid]
        n = len(p.gpus)
        if r.milli < FULL:
            assert n == 1 and p.milli == r.milli
        elif r.elastic:
            assert r.min_gpus is not None and r.max_gpus is not None
            assert r.min_gpus <= n <= r.max_gpus, (r, n)
        else:
            assert n == r.gpus, (r, n)
        gpus = np.asarray(p.gpus, dtype=np.int64)
        assert np.all(old.gpu_ok[gpus])
        assert np.all(old.node_ok[c.gpu_node[gpus]]), f"{rid} placed on a drained node"
        if r.gpu_type is not None:
            assert all(c.group_of(int(nd)).gpu.name == r.gpu_type for nd in c.gpu_node[gpus])
        span = c.span(gpus)
        if r.topology == "nvlink":
            assert span["nvlink"] == 1
        if r.topology == "leaf":
            assert span["leaf"] == 1
        if r.exclusive:
            survivors = [a for aid, a in old.allocations.items() if aid not in preempted]
            resized_to = {aid: z.gpus for aid, z in resized.items()}  # shrunk this cycle: only what it kept
            busy_nodes = {int(c.gpu_node[g]) for a in survivors for g in resized_to.get(a.id, a.gpus)}
            assert not busy_nodes & set(c.gpu_node[gpus].tolist()), f"exclusive {rid} shares a node"

    # resizes: elastic only, within [min, max]; grow only when nothing waits; shrink, back to its ask (below it only
    # under `elastic_shrink`, and only work the policy could preempt for something it placed), only for work that could
    # not be placed otherwise: work placed in this cycle takes GPUs the shrunk job gave back (holds them, or owns their
    # node exclusively), or another shrunk job moved onto them for such work. The cycle may then place everything, so
    # nothing need wait after a shrink.
    placed_reqs = [queue[rid] for rid in placed]
    thresholds = cfg.las_thresholds

    def las_ok(v: Allocation, r: Request) -> bool:
        return (
            v.request.rank <= r.rank
            and now - v.start_time >= cfg.min_runtime_s
            and _victim_level(v, now, thresholds) > _las_level(r.attained, thresholds)
        )

    shrunk = {}
    for aid, rz in resized.items():
        a = old.allocations[aid]
        r = a.request
        assert POLICIES[name].elastic and r.elastic
        assert r.min_gpus is not None and r.max_gpus is not None
        assert r.min_gpus <= len(rz.gpus) <= r.max_gpus
        assert len(set(rz.gpus)) == len(rz.gpus)
        if len(rz.gpus) > a.gpu_count:
            assert not result.pending
        elif len(rz.gpus) < r.gpus:
            assert cfg.elastic_shrink, (a, rz)
            assert any(a.request.rank < q.rank or las_ok(a, q) for q in placed_reqs), (a, rz)
            shrunk[aid] = set(a.gpus) - set(rz.gpus)
        else:
            assert len(rz.gpus) == r.gpus, (a, rz)
            shrunk[aid] = set(a.gpus) - set(rz.gpus)
    taken: set[int] = set()
    for rid, p in placed.items():
        nodes = {int(c.gpu_node[g]) for g in p.gpus} if queue[rid].exclusive else set()
        taken |= set(p.gpus) | {g for n in nodes for g in c.gpus_of_node(n)}
    needed = {aid for aid, freed in shrunk.items() if freed & taken}
    while grew := {aid for aid, freed in shrunk.items() if aid not in needed and
                   any(freed & set(resized[k].gpus) for k in needed)}:  # fmt: skip
        needed |= grew
    assert needed == shrunk.keys(), f"{sorted(shrunk.keys() - needed)} shrunk, and no work placed takes what they gave"

    # preemption: only what the policy's rule allows, for something it placed
    rule = POLICIES[name].preempt
    for aid in preempted:
        v = old.allocations[aid]
        t = v.request.tenant
        by_class = any(v.request.rank < r.rank for r in placed_reqs)
        by_las = any(las_ok(v, r) for r in placed_reqs)
        if rule is None:
            pytest.fail(f"{name} has no preemption rule but preempted {aid}")
        elif name == "priority" or rule is lower_class:
            assert by_class, f"{aid} ({v.request.priority}) preempted without a higher-class placement"
        elif rule is higher_las_level:
            assert by_las, f"{aid} preempted without a LAS reason"
        elif rule is lower_class_or_las:
            assert by_class or by_las, f"{aid} preempted without a class or LAS reason"
        elif rule is lower_class_or_more_left:
            had = v.request.attained + (now - v.start_time) * v.gpu_count * v.milli / FULL
            by_est = any(
                v.request.rank <= r.rank
                and now - v.start_time >= cfg.min_runtime_s
                and est_left(v.request, had) > cfg.preempt_gain * est_left(r)
                for r in placed_reqs
            )
            assert by_class or by_est, f"{aid} preempted without a class reason or twice the service left"
        elif rule is borrowed:
            start = sum(a.gpu_count * a.milli / FULL for a in old.allocations.values() if a.request.tenant == t)
            placed_by_t = any(queue[rid].tenant == t for rid in placed)
            assert start > QUOTAS.get(t, 0.0) or placed_by_t, f"{aid}: tenant {t} was not over its quota"
            assert any(r.tenant != t and QUOTAS.get(r.tenant, 0.0) > 0 for r in placed_reqs)
        else:
            pytest.fail(f"no oracle for the preemption rule of {name}")
    if rule is borrowed:
        _check_quota_sequence(old, result, placed_tenants={queue[rid].tenant for rid in placed})


def _check_quota_sequence(old: ClusterState, result: CycleResult, placed_tenants: set[str]) -> None:
    """Victims, in eviction order: their tenant held more than its quota at that moment.

    Checked for tenants that placed nothing this cycle (their holdings only shrink during the cycle).
    """
    usage: dict[str, float] = {}
    for a in old.allocations.values():
        usage[a.request.tenant] = usage.get(a.request.tenant, 0.0) + a.gpu_count * a.milli / FULL
    for p in result.preempted:
        v = old.allocations[p.allocation_id]
        t = v.request.tenant
        if t in placed_tenants:
            continue
        assert usage[t] > QUOTAS.get(t, 0.0) + 1e-9, (
            f"{v.id} preempted while tenant {t} holds {usage[t]:g} GPUs, not over its quota {QUOTAS.get(t, 0.0):g}"
        )
        usage[t] -= v.gpu_count * v.milli / FULL


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=40, deadline=None, derandomize=True, phases=NO_SHRINK)
@given(sc=scenarios())
@example(sc=SHRINK_THEN_ALL_PLACED)
@example(sc=SHRINK_ONLY_WHAT_IS_NEEDED)
def test_cycle_invariants(name: str, sc: Scenario) -> None:
    _cycle_twice(name, sc)


def _cycle_twice(name: str, sc: Scenario, **knobs: bool) -> None:
    cfg = SchedulerConfig(policy=name, quotas=QUOTAS, min_runtime_s=600.0, **knobs)
    snap = snapshot_of(sc.state)
    result, new = Scheduler(cfg).cycle(sc.state, sc.queue, NOW)
    assert_same_state(sc.state, snap)
    check_cycle(name, cfg, sc, result, new)
    # the resulting state schedules again without error and stays consistent
    rest = [r for r in sc.queue if r.id not in placed_ids(result)]
    result2, new2 = Scheduler(cfg).cycle(new, rest, NOW + 1.0)
    check_cycle(name, cfg, Scenario(new, rest, sc.down_node), result2, new2, NOW + 1.0)


@pytest.mark.parametrize("name", ["default", "elastic", "las-srsf"])
@settings(max_examples=40, deadline=None, derandomize=True, phases=NO_SHRINK)
@given(sc=scenarios())
@example(sc=SHRINK_THEN_ALL_PLACED)
@example(sc=SHRINK_ONLY_WHAT_IS_NEEDED)
def test_cycle_invariants_with_the_las_knobs(name: str, sc: Scenario) -> None:
    """The same invariants with `elastic_shrink`, `grow_las`, `las_size_order` and `las_newer_only` on."""
    _cycle_twice(name, sc, elastic_shrink=True, grow_las=True, las_size_order=True, las_newer_only=True)


@st.composite
def quota_scenarios(draw: st.DrawFn) -> tuple[ClusterState, list[Request], dict[str, float]]:
    """Holders h0, h1 run work; claimants c0, c1 queue. Quotas are random."""
    quotas = {t: float(draw(st.integers(0, 24))) for t in ("h0", "h1", "c0", "c1")}
    state = ClusterState(PROP_CLUSTER)
    for i in range(draw(st.integers(1, 10))):
        g = draw(st.integers(1, 8))
        milli = draw(st.sampled_from([FULL, FULL, FULL, 500]))
        req = Request(f"r{i}", 1 if milli < FULL else g, 0.0, tenant=draw(st.sampled_from(["h0", "h1"])), milli=milli)
        res = first_fit(state, req, req.gpus)
        if res.gpus is not None:
            state.reserve(Allocation(req.id, req, tuple(int(x) for x in res.gpus), float(i), milli))
    queue = [
        Request(f"q{i}", draw(st.integers(1, 24)), float(i), tenant=draw(st.sampled_from(["c0", "c1"])))
        for i in range(draw(st.integers(1, 6)))
    ]
    return state, queue, quotas


@settings(max_examples=60, deadline=None, derandomize=True, phases=NO_SHRINK)
@given(qs=quota_scenarios())
def test_fair_share_never_preempts_a_tenant_below_quota(qs: tuple[ClusterState, list[Request], dict]) -> None:
    state, queue, quotas = qs
    result, new = Scheduler(SchedulerConfig(policy="fair-share", quotas=quotas)).cycle(state, queue, 100.0)
    usage = {"h0": 0.0, "h1": 0.0}
    for a in state.allocations.values():
        usage[a.request.tenant] += a.gpu_count * a.milli / FULL
    for p in result.preempted:  # in eviction order
        v = state.allocations[p.allocation_id]
        t = v.request.tenant
        assert usage[t] > quotas[t], f"{v.id} of {t} preempted at {usage[t]:g} GPUs; quota {quotas[t]:g}"
        usage[t] -= v.gpu_count * v.milli / FULL
    # only a claimant with a quota (one that can be below it) reclaims
    if result.preempted:
        assert any(quotas[new.allocations[rid].request.tenant] > 0 for rid in placed_ids(result))
    assert set(new.allocations) == (set(state.allocations) - {p.allocation_id for p in result.preempted}) | (
        placed_ids(result)
    )


def test_class_ranks() -> None:
    assert CLASS_RANK["reserved"] > CLASS_RANK["on-demand"] > CLASS_RANK["spot"]
    assert Request("x", 1, 0.0, priority="spot").rank == CLASS_RANK["spot"]
    with pytest.raises(ValueError):
        Request("x", 2, 0.0, milli=500)
    with pytest.raises(ValueError):
        Request("x", 4, 0.0, min_gpus=5, max_gpus=8)


def test_preemption_collateral_is_bounded() -> None:
    """By default a 4-GPU request may not evict a 16-GPU gang (more than 2 GPUs per GPU it needs)."""
    res, new = run("las", _las_state(), [Request("n", 4, 250.0)], 700.0, **LAS_CFG)
    assert not res.preempted and not res.placed
    assert set(new.allocations) == {"v"}
    [pending] = res.pending
    assert "evict 16 GPUs" in pending.reason or "preempt" in pending.reason or "free" in pending.reason


@pytest.mark.parametrize(
    ("profile", "milli"), [("1g.10gb", 142), ("2g.20gb", 285), ("3g.40gb", 428), ("4g.40gb", 571), ("7g.80gb", 1000)]
)
def test_mig_profiles_map_to_slices(profile: str, milli: int) -> None:
    from suanli.sched import mig_milli

    assert mig_milli(profile) == milli


@pytest.mark.parametrize("bad", ["8g.90gb", "0g.1gb", "fast", ""])
def test_bad_mig_profile_is_rejected(bad: str) -> None:
    from suanli.sched import mig_milli

    with pytest.raises(ValueError, match="MIG profile"):
        mig_milli(bad)


def test_scaling_model_is_sublinear_and_worse_on_slow_networks() -> None:
    """More GPUs help less than linearly, and less on 25GbE than on InfiniBand (the all-reduce grows)."""
    from suanli.sched.scaling import ScalingModel
    from suanli.topology import load_preset

    fast = ScalingModel(load_preset("16x8:H100"))
    slow = ScalingModel(
        parse(
            {
                "name": "s",
                "node_groups": [{"name": "h", "count": 16, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 1}],
                "fabric": "eth-25",
            }
        )
    )
    assert fast.speedup(8, 8) == 1.0
    for n in (16, 32, 64):
        assert 1.0 < fast.speedup(n, 8) <= n / 8
        assert slow.speedup(n, 8) < fast.speedup(n, 8)
    assert fast.best_size(8, 8, 128) >= slow.best_size(8, 8, 128)


def test_elastic_growth_stops_where_gpus_stop_paying() -> None:
    """On 25GbE a data-parallel job does not grow across nodes; on NVLink inside one node it does."""
    from suanli.sched.scaling import ScalingModel

    slow = ScalingModel(
        parse(
            {
                "name": "s",
                "node_groups": [{"name": "h", "count": 4, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 1}],
                "fabric": "eth-25",
            }
        )
    )
    assert slow.best_size(2, 2, 8) == 8  # inside the NVLink node: the all-reduce stays cheap
    assert slow.best_size(8, 8, 32) == 8  # crossing 25GbE: every extra GPU buys too little


def test_an_exclusive_workload_owns_its_whole_node() -> None:
    """A 2-GPU exclusive job takes a free node; the node's 6 other GPUs stay closed to everyone else."""
    s = ClusterState(two_nodes())
    x = Request("x", 2, 0.0, exclusive=True)
    gpus = topology_aware(s, x, 2).gpus
    assert gpus is not None
    s.reserve(Allocation("x", x, tuple(int(g) for g in gpus), 0.0))
    node = int(s.gpu_node[gpus[0]])
    other = topology_aware(s, Request("y", 6, 0.0), 6).gpus
    assert other is not None and node not in set(s.gpu_node[other].tolist())
    with pytest.raises(ValueError, match="exclusive"):
        free_on_node = [g for g in s.cluster.gpus_of_node(node) if g not in gpus][:1]
        y = Request("z", 1, 0.0)
        s.reserve(Allocation("z", y, tuple(free_on_node), 0.0))
    s.unreserve("x")
    assert not s.node_exclusive.any()


def test_preemption_survives_a_victim_on_an_unhealthy_gpu() -> None:
    """A victim the placement does not need is given back even if one of its GPUs went unhealthy."""
    s = ClusterState(two_nodes())
    occupy(s, "spotA", (0,), priority="spot", start=0.0)
    occupy(s, "spotB", tuple(range(1, 8)), priority="spot", start=0.0)
    occupy(s, "od", node_gpus(1))
    s.set_gpu_ok(0, False)
    res, new = run("priority", s, [Request("x", 2, 1.0)], 2.0, preempt_collateral=8.0)
    assert placed_ids(res) == {"x"}
    assert "spotA" in new.allocations  # not needed: restored, bad GPU and all


def test_simulator_handles_gangs_across_node_groups() -> None:
    from suanli.sim import SimConfig, TraceJob, simulate

    het = parse(
        {
            "name": "het",
            "node_groups": [
                {"name": "h", "count": 2, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8},
                {"name": "a", "count": 3, "gpu": "A100-SXM-80G", "gpus_per_node": 4, "nics": 4},
            ],
            "fabric": "ib-ndr",
        }
    )
    r = simulate([TraceJob("big", 0.0, 20, 100.0)], het, SimConfig())
    assert r.finished == 1


def test_preemption_does_not_jump_an_easy_reservation() -> None:
    """R holds 8 GPUs until t=100, a spot job 4; the head needs 12 and gets a reservation at t=100. A long
    8-GPU job must not preempt the spot job and take the 4 free GPUs too: the head would slip past t=100."""
    s = ClusterState(two_nodes())
    occupy(s, "r", node_gpus(0), est_runtime=100.0)
    occupy(s, "spot", (8, 9, 10, 11), priority="spot")
    head = Request("head", 12, 0.0, est_runtime=50.0)
    long = Request("long", 8, 1.0, est_runtime=1_000.0)
    res, new = run("priority", s, [head, long], 0.0, preempt_collateral=8.0)
    assert not res.preempted
    assert "long" not in new.allocations
    assert "reservation" in pending_reason(res, "long")
