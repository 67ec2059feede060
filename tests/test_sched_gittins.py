"""The Gittins index from samples (`sched/gittins.py`), and the `gittins` queue order that reads it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.sched import SchedulerConfig
from suanli.sched.estimates import RuntimeHistory
from suanli.sched.gittins import index
from suanli.sched.policies import PolicyContext, by_class_las, gittins_rate
from suanli.sched.state import ClusterState
from suanli.sched.types import Request
from suanli.sim import SimConfig
from suanli.sim.engine import Simulation
from suanli.sim.workload import TraceJob
from suanli.topology import load_preset

samples_st = st.lists(st.floats(min_value=1.0, max_value=1e6), min_size=1, max_size=40).map(lambda s: tuple(sorted(s)))


def brute(samples: tuple[float, ...], ran: float) -> float:
    """The definition, term by term: max over cut-offs b > ran of P(D <= b | D > ran) / E[min(D, b) - ran | D > ran]."""
    alive = [s for s in samples if s > ran]
    if not alive:
        return 1.0 / ran
    best = 0.0
    for b in sorted(set(alive)):
        done = sum(1 for s in alive if s <= b) / len(alive)
        spent = sum(min(s, b) - ran for s in alive) / len(alive)
        best = max(best, done / spent)
    return best


@settings(max_examples=200, deadline=None)
@given(samples_st, st.floats(min_value=0.0, max_value=2e6))
def test_the_index_is_its_definition(samples: tuple[float, ...], ran: float) -> None:
    if ran == 0.0 and not any(s > 0 for s in samples):
        return
    got, want = index(samples, ran), brute(samples, ran)
    assert abs(got - want) <= 1e-9 * max(1.0, want)


@settings(max_examples=100, deadline=None)
@given(samples_st)
def test_a_fresh_job_is_worth_at_least_one_over_its_mean(samples: tuple[float, ...]) -> None:
    """Cutting off at the longest sample completes the job for sure at its mean cost: G(0) >= 1 / E[D]."""
    mean = sum(samples) / len(samples)
    assert index(samples, 0.0) >= 1.0 / mean * (1 - 1e-12)


def test_one_known_length_is_worth_one_over_what_is_left() -> None:
    assert index((100.0, 100.0, 100.0), 0.0) == 1 / 100
    assert index((100.0, 100.0, 100.0), 40.0) == 1 / 60


def test_heavy_tails_say_las_and_alike_lengths_say_run_to_completion() -> None:
    """Decreasing hazard (most jobs tiny, a few long): the index falls as a job runs, so fresh work goes first.
    Similar lengths: it rises, so work that has run goes first. Past every sample: as much again as it had."""
    tiny_and_long = tuple(sorted([10.0] * 90 + [10_000.0] * 10))
    assert index(tiny_and_long, 0.0) > 10 * index(tiny_and_long, 20.0)
    pareto = tuple(sorted(100.0 / ((k + 0.5) / 200) ** 1.5 for k in range(200)))  # P(D > x) ~ x^(-2/3)
    assert index(pareto, 0.0) > index(pareto, 1_000.0) > index(pareto, 10_000.0) > index(pareto, 100_000.0)
    alike = tuple(float(x) for x in range(900, 1_101, 10))
    assert index(alike, 0.0) < index(alike, 500.0) < index(alike, 950.0)
    assert index(alike, 5_000.0) == 1 / 5_000.0


def _ctx(**knobs: object) -> PolicyContext:
    return PolicyContext(SchedulerConfig(gittins=True, **knobs), 0.0, ClusterState(load_preset("1x8:H100")), {})


def test_the_queue_puts_the_highest_rate_per_gpu_first_within_a_class() -> None:
    ctx = _ctx()
    short = Request("short", 1, submit_time=50.0, est_samples=(60.0, 60.0, 60.0))
    long = Request("long", 1, submit_time=0.0, est_samples=(6_000.0, 6_000.0, 6_000.0))
    wide = Request("wide", 8, submit_time=10.0, est_samples=(600.0, 600.0, 600.0))  # 4,800 GPU-s: between them
    spot_short = Request("spot", 1, submit_time=0.0, priority="spot", est_samples=(1.0, 1.0, 1.0))
    order = sorted([long, spot_short, wide, short], key=lambda r: by_class_las(r, ctx))
    assert [r.id for r in order] == ["short", "wide", "long", "spot"]


def test_work_without_samples_is_ranked_by_its_las_level() -> None:
    """No samples: one over the LAS level's upper bound. A fresh job ranks as work expected to finish within the first
    level (an hour of GPU-time); one past the first threshold ranks below a known 2-hour job."""
    ctx = _ctx()
    fresh = Request("fresh", 1, submit_time=0.0)
    served = Request("served", 1, submit_time=0.0, attained=4_000.0)
    two_hours = Request("2h", 1, submit_time=0.0, est_samples=(7_200.0, 7_200.0, 7_200.0))
    assert gittins_rate(fresh, 0.0, ctx) == 1 / 3_600.0
    assert gittins_rate(served, served.attained, ctx) == 1 / 36_000.0
    order = sorted([served, two_hours, fresh], key=lambda r: by_class_las(r, ctx))
    assert [r.id for r in order] == ["fresh", "2h", "served"]


def test_history_versions_count_each_tenants_records() -> None:
    h = RuntimeHistory()
    assert h.version("a") == 0
    h.record("a", None, 1, 10.0)
    h.record("a", None, 1, -1.0)  # not a duration: not recorded, no new version
    h.record("b", None, 1, 10.0)
    assert (h.version("a"), h.version("b")) == (1, 1)


def _jobs() -> list[TraceJob]:
    """One 1-GPU cluster: a long job holds it while three short ones finish before a fourth arrives."""
    return [
        TraceJob("hog", 0.0, 1, 5_000.0, tenant="t"),
        *(TraceJob(f"s{i}", 1.0 + i, 1, 100.0, tenant="t") for i in range(3)),
        TraceJob("late", 10.0, 1, 100.0, tenant="t"),
    ]


def test_queued_work_sees_the_history_that_grew_while_it_waited() -> None:
    """The simulator retakes a queued job's samples when its tenant's history grows (with `gittins` only): the
    `late` job arrived before anything finished, and must be ordered by what finished since."""
    sim = Simulation(_jobs(), load_preset("1x1:H100"), SimConfig(scheduler=SchedulerConfig(gittins=True)))
    assert sim.refresh_estimates
    sim.run()
    assert sim.requests[4].est_samples  # taken again after the first finishes (none had finished at its arrival)
    plain = Simulation(_jobs(), load_preset("1x1:H100"), SimConfig())
    assert not plain.refresh_estimates
    plain.run()
    assert plain.requests[4].est_samples == ()
