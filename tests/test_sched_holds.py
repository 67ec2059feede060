"""GPUs held back for plans (`ClusterState.hold`, `sched.holds`): a count per GPU model that work other than the
plan holder's own reserved work may not take. Issue: an active plan's GPUs were handed to on-demand and spot work, so
a plan holder could find its plan's GPUs taken. The pure core: tables, then a property over random cycles."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.sched import POLICIES, ClusterState, Request, Scheduler, SchedulerConfig
from suanli.sched.types import FULL, Allocation
from tests.clusters import homogeneous_cluster
from tests.test_sched import (
    A100,
    H100,
    NO_SHRINK,
    NOW,
    QUOTAS,
    hetero,
    occupy,
    pending_reason,
    placed_ids,
    requests,
    scenarios,
)

H20 = "H20"


def h20(nodes: int = 4) -> ClusterState:
    return ClusterState(homogeneous_cluster(H20, nodes=nodes, gpn=8))


def _cycle(state: ClusterState, queue: list[Request], policy: str = "default", now: float = 1000.0) -> tuple:
    return Scheduler(SchedulerConfig(policy=policy)).cycle(state, queue, now)


def test_other_work_leaves_the_held_count_free_and_the_plan_holders_work_takes_it() -> None:
    s = h20()  # 32 H20
    s.hold({H20: {"A": 16}})
    queue = [Request(f"od{i}", 8, float(i), tenant="B") for i in range(3)]
    queue += [
        Request("spot", 1, 5.0, tenant="B", priority="spot"),
        Request("b-plan", 24, 6.0, "B", priority="reserved"),
    ]
    res, new = _cycle(s, queue)
    assert placed_ids(res) == {"od0", "od1"}  # before: all three, and the spot job
    why = pending_reason(res, "od2")
    assert why.startswith("needs 8 H20; 16 free, of which plans hold back 16"), why
    assert "plans hold back 16" in pending_reason(res, "spot")
    assert "plans hold back 16" in pending_reason(res, "b-plan")  # another tenant's plan work: not its hold
    assert new.free_whole_of(H20) == 16 and new.held == {H20: {"A": 16}}

    res, after = _cycle(new, [Request("a-plan", 16, 10.0, tenant="A", priority="reserved")], now=1001.0)
    assert placed_ids(res) == {"a-plan"} and not res.preempted
    assert after.held == {H20: {"A": 0}}  # it took its hold
    after.unreserve("a-plan")  # its work ends: the plan's GPUs are idle, held back again
    assert after.held == {H20: {"A": 16}}


def test_a_hold_is_a_count_not_particular_gpus() -> None:
    """Whatever GPUs other work takes, the count stays free; a reserved job larger than one node still fits."""
    s = h20()
    s.hold({H20: {"A": 16}})
    occupy(s, "x", (0, 1, 2), tenant="B")  # node 0 partly used
    res, new = _cycle(s, [Request("od", 13, 1.0, tenant="B")])
    assert placed_ids(res) == {"od"} and new.free_whole_of(H20) == 16
    res, _ = _cycle(new, [Request("a", 16, 2.0, tenant="A", priority="reserved")], now=1001.0)
    assert placed_ids(res) == {"a"}


def test_elastic_work_does_not_grow_into_held_gpus() -> None:
    s = h20()
    s.hold({H20: {"A": 16}})
    occupy(s, "el", (0, 1, 2, 3), tenant="B", min_gpus=1, max_gpus=32)
    res, new = _cycle(s, [], policy="elastic")
    [rz] = res.resized
    assert len(rz.gpus) == 16 and new.free_whole_of(H20) == 16  # grew into the 12 not held, not beyond


def test_spot_work_on_held_gpus_gives_way_and_on_demand_work_takes_only_what_is_not_held() -> None:
    """A plan bought while spot work fills the cluster: spot work gives way to the plan's work. On-demand work may
    preempt spot work too, but only while the held count stays to be had (free, or held by spot work)."""
    s = h20()
    for n in range(4):
        occupy(s, f"spot{n}", tuple(range(8 * n, 8 * n + 8)), tenant="C", priority="spot", start=float(n))
    s.hold({H20: {"A": 16}})
    queue = [Request(f"od{i}", 8, float(i), tenant="B") for i in range(3)]
    res, new = _cycle(s, queue)
    assert placed_ids(res) == {"od0", "od1"} and len(res.preempted) == 2  # before: all three
    why = pending_reason(res, "od2")
    assert why.endswith("would not make room: needs 8 H20; 16 free, of which plans hold back 16"), why
    res, _ = _cycle(new, [Request("a", 16, 2.0, tenant="A", priority="reserved")], now=1001.0)
    assert placed_ids(res) == {"a"} and len(res.preempted) == 2
    assert all("spot work gives way to reserved work" in p.reason for p in res.preempted)


def test_a_request_for_several_models_goes_to_one_whose_count_allows_it() -> None:
    s = ClusterState(hetero())  # 16 H100 (GPUs 0..15), 12 A100 (16..27)
    s.hold({H100: {"A": 12}})
    res, new = _cycle(s, [Request("any", 8, 0.0, tenant="B")])
    [p] = res.placed
    assert all(g >= 16 for g in p.gpus), p  # the A100s: 4 H100 are not held, too few
    assert new.free_whole_of(H100) == 16
    res, new = _cycle(s, [Request("h4", 4, 0.0, tenant="B", gpu_type=H100), Request("h1", 1, 1.0, gpu_type=H100)])
    assert placed_ids(res) == {"h4"} and new.free_whole_of(H100) == 12
    assert pending_reason(res, "h1").startswith("needs 1 H100-SXM; 12 free, of which plans hold back 12")


def test_nothing_held_changes_nothing() -> None:
    a, b = h20(), h20()
    b.hold({})
    queue = [Request(f"q{i}", 8, float(i)) for i in range(5)]
    assert _cycle(a, queue)[0].placed == _cycle(b, queue)[0].placed


# --- property: over random cycles, work other than the holder's never takes what is held back ----------------------


@settings(max_examples=60, deadline=None, derandomize=True, phases=NO_SHRINK)
@given(
    sc=scenarios(),
    held=st.dictionaries(st.sampled_from([H100, A100]), st.integers(0, 16), max_size=2),
    extra=st.lists(requests("x", 32, running=False), max_size=4),
    policy=st.sampled_from(list(POLICIES)),
)
def test_a_cycle_never_hands_what_is_held_to_other_work(sc, held, extra, policy) -> None:  # type: ignore[no-untyped-def]
    """Tenant t0 holds GPUs of each model; no t0 reserved work runs or waits, so nothing takes from the holds. After
    any cycle, of each model, the GPUs to be had (free; and held by spot work, under a policy where it gives way to
    reserved work) are at least the held count, or at least what they were before the cycle where that was less."""
    state = sc.state.copy()
    for a in [a for a in state.allocations.values() if a.request.tenant == "t0" and a.request.priority == "reserved"]:
        state.unreserve(a.id)
    state.hold({m: {"t0": n} for m, n in held.items()})
    queue = [r for r in sc.queue + [Request(f"x{i}", r.gpus, r.submit_time, r.tenant, r.gpu_type, r.milli,
                                            r.min_gpus, r.max_gpus, r.topology, r.exclusive, r.nodes, r.priority)
                                    for i, r in enumerate(extra)]
             if not (r.tenant == "t0" and r.priority == "reserved")]  # fmt: skip
    yields = POLICIES[policy].class_preemption

    def available(s: ClusterState, model: str) -> int:
        spot = sum(1 for a in s.allocations.values() if a.request.priority == "spot" and a.milli == FULL
                   for g in a.gpus if s.cluster.group_of(int(s.gpu_node[g])).gpu.name == model
                   and s.node_ok[s.gpu_node[g]])  # fmt: skip
        return s.free_whole_of(model) + (spot if yields else 0)

    before = {m: available(state, m) for m in held}
    cfg = SchedulerConfig(policy=policy, quotas=QUOTAS, min_runtime_s=600.0)
    _, new = Scheduler(cfg).cycle(state, queue, NOW)
    assert new.held == state.held
    for m, n in held.items():
        assert available(new, m) >= min(n, before[m]), (m, n, before[m], available(new, m))


def test_unreserve_gives_back_only_what_an_allocation_took() -> None:
    s = h20(nodes=2)
    s.hold({H20: {"A": 4}})
    req = Request("a", 6, 0.0, tenant="A", priority="reserved")
    s.reserve(Allocation("a", req, tuple(range(6)), 0.0, FULL))
    assert s.held == {H20: {"A": 0}} and s.hold_taken == {"a": ((H20, 4),)}
    copy = s.copy()
    copy.unreserve("a")
    assert copy.held == {H20: {"A": 4}} and s.held == {H20: {"A": 0}}  # the copy's, not the original's
