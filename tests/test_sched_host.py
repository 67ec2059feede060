"""Host CPU and memory in the scheduling core: a node with free GPUs but no free cores takes no more work.

Tracked only when a `ClusterState` is given the nodes' hosts (`host=`); requests carry totals, spread over their
nodes in proportion to their GPUs there.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.sched import FULL, PLACEMENTS, Allocation, ClusterState, Request, Scheduler, SchedulerConfig
from tests.clusters import homogeneous_cluster

GPN = 8


def state(cpu: list[int], mem: list[int] | None = None) -> ClusterState:
    cluster = homogeneous_cluster(nodes=len(cpu), gpn=GPN)
    return ClusterState(cluster, host=(cpu, mem if mem is not None else [1 << 20] * len(cpu)))


def nodes_of(st_: ClusterState, gpus: object) -> list[int]:
    return sorted({int(n) for n in st_.gpu_node[np.asarray(gpus, dtype=np.int64)]})


@pytest.mark.parametrize("placer", PLACEMENTS.values(), ids=PLACEMENTS.keys())
def test_a_node_without_the_cores_is_skipped_though_its_gpus_are_free(placer) -> None:
    s = state([4_000, 64_000])  # node 0 has 4 cores: not the 8 that one GPU of this request comes with
    res = placer(s, Request("r", 2, 0.0, cpu_milli=16_000), 2)
    assert res.gpus is not None and nodes_of(s, res.gpus) == [1]


@pytest.mark.parametrize("placer", PLACEMENTS.values(), ids=PLACEMENTS.keys())
def test_memory_limits_as_cpu_does(placer) -> None:
    s = state([64_000, 64_000], mem=[4_096, 65_536])
    res = placer(s, Request("r", 1, 0.0, memory_mib=8_192), 1)
    assert res.gpus is not None and nodes_of(s, res.gpus) == [1]


@pytest.mark.parametrize("placer", PLACEMENTS.values(), ids=PLACEMENTS.keys())
def test_no_node_with_the_cpu_says_so(placer) -> None:
    s = state([8_000, 8_000])
    res = placer(s, Request("r", 1, 0.0, cpu_milli=16_000), 1)
    assert res.gpus is None  # never, not now: no node has 16 cores
    assert "16 CPUs" in res.reason and "for at most 0 of them, even when idle" in res.reason
    s = state([8_000, 64_000])
    s.reserve(Allocation("busy", Request("busy", 1, 0.0, cpu_milli=60_000), (8,), 0.0))  # node 1's cores, now
    res = placer(s, Request("r", 1, 0.0, cpu_milli=16_000), 1)
    assert res.gpus is None and "only 0 free GPUs are on nodes with that CPU and memory free" in res.reason
    s = state([8_000, 64_000])
    s.set_node_ok(1, False)  # drained: it may come back, so this is not "never"
    res = placer(s, Request("r", 1, 0.0, cpu_milli=16_000), 1)
    assert res.gpus is None and "even when idle" not in res.reason


def test_a_gang_spread_over_nodes_takes_cpu_in_proportion_to_its_gpus_there() -> None:
    s = state([64_000, 64_000, 64_000])
    req = Request("gang", 12, 0.0, cpu_milli=36_000, memory_mib=1_200)
    res = PLACEMENTS["topology"](s, req, 12)
    assert res.gpus is not None
    s.reserve(Allocation("gang", req, tuple(int(g) for g in res.gpus), 0.0))
    per_node = np.bincount(s.gpu_node[np.asarray(res.gpus)], minlength=3)
    taken = 64_000 - s.cpu_free
    assert (taken == 36_000 * per_node // 12).all() and taken.sum() == 36_000
    assert ((1 << 20) - s.mem_free).sum() == 1_200
    s.unreserve("gang")
    assert (s.cpu_free == 64_000).all() and (s.mem_free == 1 << 20).all()


def test_each_node_carries_only_the_share_its_cpu_allows() -> None:
    """16 GPUs with 32 cores: 2 cores a GPU. Node 0 has 6 cores free, so it carries 3 GPUs of the gang."""
    s = state([6_000, 64_000, 64_000])
    req = Request("gang", 16, 0.0, cpu_milli=32_000)
    res = PLACEMENTS["first-fit"](s, req, 16)
    assert res.gpus is not None
    per_node = np.bincount(s.gpu_node[np.asarray(res.gpus)], minlength=3)
    assert per_node[0] <= 3 and per_node.sum() == 16
    s.reserve(Allocation("gang", req, tuple(int(g) for g in res.gpus), 0.0))
    assert (s.cpu_free >= 0).all()


def test_gpu_slices_skip_a_node_short_of_memory() -> None:
    s = state([64_000, 64_000], mem=[1_000, 100_000])
    held = Request("held", 1, 0.0, milli=500)
    s.reserve(Allocation("held", held, (0,), 0.0, 500))  # node 0 has a half-free shared GPU: best fit
    res = PLACEMENTS["topology"](s, Request("r", 1, 0.0, milli=500, memory_mib=2_000), 1)
    assert res.gpus is not None and nodes_of(s, res.gpus) == [1]
    res = PLACEMENTS["topology"](s, Request("r", 1, 0.0, milli=500, memory_mib=500), 1)
    assert res.gpus is not None and list(res.gpus) == [0]


def test_reserve_refuses_what_the_nodes_cannot_hold_and_restore_does_not_check() -> None:
    s = state([4_000, 64_000])
    req = Request("r", 1, 0.0, cpu_milli=8_000)
    with pytest.raises(ValueError, match="lack the CPU or memory"):
        s.reserve(Allocation("r", req, (0,), 0.0))
    assert s.cpu_free.tolist() == [4_000, 64_000] and s.node_whole[0] == GPN  # nothing taken
    s.reserve(Allocation("r", req, (0,), 0.0), restore=True)  # it held them already (a snapshot of running work)
    assert s.cpu_free.tolist() == [-4_000, 64_000]


def test_an_untracked_state_ignores_cpu_and_memory() -> None:
    s = ClusterState(homogeneous_cluster(nodes=1, gpn=GPN))
    req = Request("r", 8, 0.0, cpu_milli=10**9, memory_mib=10**9)
    res = PLACEMENTS["topology"](s, req, 8)
    assert res.gpus is not None
    s.reserve(Allocation("r", req, tuple(int(g) for g in res.gpus), 0.0))
    assert s.cpu_free is None and s.free_whole_gpus() == 0


@pytest.mark.parametrize("policy", ["fifo", "default"])
def test_elastic_work_placed_at_its_minimum_takes_its_share_per_gpu(policy: str) -> None:
    """8 GPUs with 8 cores is one core a GPU: at its minimum of 4 the request takes 4 cores, which node 0 has."""
    s = state([4_000, 64_000])
    s.reserve(Allocation("busy", Request("busy", 8, 0.0), tuple(range(8, 16)), 0.0))  # node 1's GPUs
    req = Request("e", 8, 0.0, min_gpus=4, max_gpus=8, cpu_milli=8_000)
    result, after = Scheduler(SchedulerConfig(policy=policy)).cycle(s, [req], 0.0)
    assert [len(p.gpus) for p in result.placed] == [4]
    assert after.cpu_free is not None and after.cpu_free.tolist() == [0, 64_000]


def test_tracking_hosts_with_cpu_to_spare_places_as_untracked_does() -> None:
    """Host limits only remove nodes that lack CPU or memory; among the rest, best fit is unchanged."""
    cluster = homogeneous_cluster(nodes=2, gpn=GPN)
    picks = []
    for host in (None, ([64_000, 64_000], [1 << 20, 1 << 20])):
        s = ClusterState(cluster, host=host)
        s.reserve(Allocation("busy", Request("busy", 7, 0.0), tuple(range(8, 15)), 0.0))  # node 1: 1 GPU free
        res = PLACEMENTS["topology"](s, Request("r", 1, 0.0, cpu_milli=1_000, memory_mib=1_024), 1)
        assert res.gpus is not None
        grown, _ = Scheduler(SchedulerConfig(policy="elastic")).cycle(
            ClusterState(homogeneous_cluster(nodes=4, gpn=GPN), host=None if host is None else ([64_000] * 4,
                         [1 << 20] * 4)),
            [Request("g", 2, 0.0, min_gpus=1, max_gpus=8, cpu_milli=2_000, model=None)], 0.0)  # fmt: skip
        picks.append((nodes_of(s, res.gpus), sorted(grown.placed[0].gpus)))
    assert picks[0] == picks[1] and picks[0][0] == [1]


def test_a_node_left_over_its_cpu_does_not_hide_the_others() -> None:
    s = state([4_000, 64_000])
    s.reserve(Allocation("old", Request("old", 1, 0.0, cpu_milli=8_000), (0,), 0.0), restore=True)  # over, held
    assert s.cpu_free is not None and s.cpu_free[0] < 0
    res = PLACEMENTS["topology"](s, Request("r", 8, 0.0, cpu_milli=8_000), 8)
    assert res.gpus is not None and nodes_of(s, res.gpus) == [1]


def test_bad_host_figures_are_refused() -> None:
    cluster = homogeneous_cluster(nodes=2, gpn=GPN)
    with pytest.raises(ValueError, match="one CPU and one memory figure per node"):
        ClusterState(cluster, host=([1], [1]))
    with pytest.raises(ValueError, match=">= 0"):
        ClusterState(cluster, host=([1, -1], [1, 1]))
    with pytest.raises(ValueError, match="cpu_milli"):
        Request("r", 1, 0.0, cpu_milli=-1)


_REQ = st.tuples(
    st.sampled_from([1, 1, 2, 4, 8, 12]),
    st.sampled_from([FULL, FULL, 250, 500]),
    st.integers(0, 40_000),
    st.integers(0, 300_000),
    st.booleans(),  # elastic: [gpus // 2, 2 * gpus], for whole GPUs
)


def _request(i: int, item: tuple[int, int, int, int, bool], tag: str = "r", **kw: object) -> Request:
    k, milli, c, m, elastic = item
    span = {"min_gpus": max(1, k // 2), "max_gpus": 2 * k} if elastic and milli == FULL and k > 1 else {}
    return Request(f"{tag}{i}", 1 if milli < FULL else k, float(i), milli=milli, cpu_milli=c, memory_mib=m,
                   **span, **kw)  # type: ignore[arg-type]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    cpu=st.lists(st.integers(0, 64_000), min_size=3, max_size=3),
    mem=st.lists(st.integers(0, 512_000), min_size=3, max_size=3),
    reqs=st.lists(_REQ, min_size=1, max_size=25),
    policy=st.sampled_from(["default", "fifo", "las", "fair-share", "elastic"]),
)
def test_a_cycle_never_puts_a_node_over_its_cpu_or_memory(
    cpu: list[int], mem: list[int], reqs: list[tuple[int, int, int, int, bool]], policy: str
) -> None:
    s = ClusterState(homogeneous_cluster(nodes=3, gpn=GPN), host=(cpu, mem))
    queue = [_request(i, item) for i, item in enumerate(reqs)]
    result, after = Scheduler(SchedulerConfig(policy=policy)).cycle(s, queue, 0.0)
    assert after.cpu_free is not None and after.mem_free is not None
    assert (after.cpu_free >= 0).all() and (after.mem_free >= 0).all()
    assert {p.request_id for p in result.placed} == set(after.allocations)
    taken_cpu = np.zeros(3, dtype=np.int64)
    for a in after.allocations.values():
        nodes, c, _ = after._host_charge(a)
        taken_cpu[nodes] += c
    assert (np.asarray(cpu) - after.cpu_free == taken_cpu).all()
    assert s.cpu_free is not None and s.cpu_free.tolist() == cpu  # the input state is untouched
    for a in list(after.allocations):
        after.unreserve(a)
    assert after.cpu_free.tolist() == cpu and after.mem_free.tolist() == mem


@settings(max_examples=60, deadline=None)
@given(
    cpu=st.lists(st.integers(8_000, 64_000), min_size=3, max_size=3),
    running=st.lists(_REQ, min_size=1, max_size=12),
    waiting=st.lists(_REQ, min_size=1, max_size=8),
    policy=st.sampled_from(["default", "priority", "las", "elastic"]),
)
def test_preemption_gives_back_no_victim_whose_cores_the_placement_took(
    cpu: list[int],
    running: list[tuple[int, int, int, int, bool]],
    waiting: list[tuple[int, int, int, int, bool]],
    policy: str,
) -> None:
    """Victims the placement does not need go back onto their GPUs only if their nodes' CPU and memory are
    still free beside the placement; otherwise they stay evicted."""
    mem = [1 << 20] * 3
    s = ClusterState(homogeneous_cluster(nodes=3, gpn=GPN), host=(cpu, mem))
    sched = Scheduler(SchedulerConfig(policy=policy))

    def reqs(items: list[tuple[int, int, int, int, bool]], tag: str, priority: str, t: float) -> list[Request]:
        return [_request(i, (k, milli, c, 0, el), tag, priority=priority, attained=10**7 if tag == "old" else 0.0)
                for i, (k, milli, c, _, el) in enumerate(items)]  # fmt: skip

    _, s = sched.cycle(s, reqs(running, "old", "spot", 0.0), 0.0)
    result, after = sched.cycle(s, reqs(waiting, "new", "on-demand", 10_000.0), 10_000.0)
    assert after.cpu_free is not None and (after.cpu_free >= 0).all()
    gone = {p.allocation_id for p in result.preempted}
    assert gone.isdisjoint(after.allocations) and gone <= set(s.allocations)
    taken = np.zeros(3, dtype=np.int64)
    for a in after.allocations.values():
        nodes, c, _ = after._host_charge(a)
        taken[nodes] += c
    assert (np.asarray(cpu) - after.cpu_free == taken).all()
