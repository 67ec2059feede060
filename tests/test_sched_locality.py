"""Two knobs that make placement and preemption count their cost, both off by default: locality wait (delay
scheduling: a gang one node could hold waits a bounded time for one node rather than start split over several) and
`las_newer_only` (LAS preemption only for work that joined the queue after the victim started)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.sched import Allocation, ClusterState, Request, Scheduler, SchedulerConfig
from suanli.topology import load_preset


def fragmented() -> ClusterState:
    """Two 8-GPU nodes with 6 GPUs held on each: 2 free per node, 4 free in all."""
    s = ClusterState(load_preset("2x8:H100"))
    s.reserve(Allocation("a", Request("a", 6, 0.0), (0, 1, 2, 3, 4, 5), 0.0))
    s.reserve(Allocation("b", Request("b", 6, 0.0), (8, 9, 10, 11, 12, 13), 0.0))
    return s


def test_off_by_default_a_gang_starts_split() -> None:
    result, _ = Scheduler(SchedulerConfig(policy="fifo-backfill")).cycle(fragmented(), [Request("g", 4, 0.0)], 10.0)
    assert len(result.placed) == 1


def test_a_small_gang_waits_for_one_node_then_splits_when_the_bound_is_up() -> None:
    sched = Scheduler(SchedulerConfig(policy="fifo-backfill", locality_wait_s=600.0))
    req = Request("g", 4, 0.0)
    result, _ = sched.cycle(fragmented(), [req], 599.0)
    assert not result.placed and "one node" in result.pending[0].reason
    result, _ = sched.cycle(fragmented(), [req], 600.0)
    assert len(result.placed) == 1  # waited its bound: it starts split rather than wait on


def test_a_gang_whose_owner_asked_for_any_placement_starts_split_at_once() -> None:
    """`topology: any` is the tenant's choice to start on any free GPUs now; the wait is for `auto` (the default:
    the scheduler's choice), and a hard constraint (`nvlink`) never starts split at all."""
    sched = Scheduler(SchedulerConfig(policy="fifo-backfill", locality_wait_s=1e9))
    now_any, _ = sched.cycle(fragmented(), [Request("g", 4, 0.0, topology="any")], 10.0)
    assert len(now_any.placed) == 1
    assert np.unique(fragmented().gpu_node[np.asarray(now_any.placed[0].gpus)]).size == 2
    auto, _ = sched.cycle(fragmented(), [Request("g", 4, 0.0)], 10.0)
    assert Request("g", 4, 0.0).topology == "auto" and not auto.placed and "one node" in auto.pending[0].reason
    nvlink, _ = sched.cycle(fragmented(), [Request("g", 4, 0.0, topology="nvlink")], 1e10)
    assert not nvlink.placed


def test_a_spec_asks_auto_unless_it_says_any_and_the_scheduler_sees_which() -> None:
    from suanli.workloads.models import WorkloadSpec

    plain = WorkloadSpec.model_validate({"name": "t", "command": "x", "resources": {"gpus": 2}})
    chosen = WorkloadSpec.model_validate({"name": "t", "command": "x", "resources": {"gpus": 2, "topology": "any"}})
    assert plain.resources.topology == "auto" and chosen.resources.topology == "any"
    assert plain.to_request("a", 0.0, "t").topology == "auto" and chosen.to_request("b", 0.0, "t").topology == "any"


def test_work_that_cannot_fit_one_node_is_not_held_back() -> None:
    s = ClusterState(load_preset("2x8:H100"))
    result, _ = Scheduler(SchedulerConfig(policy="fifo-backfill", locality_wait_s=1e9)).cycle(
        s, [Request("big", 12, 0.0)], 1.0
    )
    assert len(result.placed) == 1


@settings(max_examples=60, deadline=None)
@given(held=st.lists(st.integers(0, 8), min_size=4, max_size=4), k=st.integers(2, 8), waited=st.floats(0, 1000))
def test_within_the_bound_nothing_starts_split(held: list[int], k: int, waited: float) -> None:
    s = ClusterState(load_preset("4x8:H100"))
    for n, h in enumerate(held):
        if h:
            s.reserve(Allocation(f"x{n}", Request(f"x{n}", h, 0.0), tuple(range(8 * n, 8 * n + h)), 0.0))
    sched = Scheduler(SchedulerConfig(policy="fifo-backfill", locality_wait_s=500.0))
    result, _ = sched.cycle(s, [Request("g", k, 0.0)], waited)
    for p in result.placed:
        nodes = np.unique(s.gpu_node[np.asarray(p.gpus)])
        assert nodes.size == 1 or waited >= 500.0
    fits_one = any(8 - h >= k for h in held)
    fits_all = sum(8 - h for h in held) >= k
    assert bool(result.placed) == (fits_one or (fits_all and waited >= 500.0))


def test_las_newer_only_preempts_for_new_arrivals_not_for_old_waiters() -> None:
    """A victim with 20 GPU-h of service on a full node: a fresh job that was already waiting when the victim started
    does not preempt it under `las_newer_only`; one that joined the queue after it started does."""
    s = ClusterState(load_preset("1x8:H100"))
    victim = Request("v", 8, 0.0, attained=0.0)
    s.reserve(Allocation("v", victim, tuple(range(8)), 1000.0))
    now = 1000.0 + 9000.0  # 8 GPUs x 9000 s = 20 GPU-h: above the first two LAS thresholds
    old = Request("old", 8, 500.0)  # waiting since before the victim started
    new = Request("new", 8, 5000.0)
    on = Scheduler(SchedulerConfig(policy="default", las_newer_only=True))
    off = Scheduler(SchedulerConfig(policy="default"))
    assert not on.cycle(s, [old], now)[0].preempted
    assert [p.allocation_id for p in off.cycle(s, [old], now)[0].preempted] == ["v"]
    assert [p.allocation_id for p in on.cycle(s, [new], now)[0].preempted] == ["v"]
