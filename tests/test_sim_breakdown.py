"""The GPU-time breakdown of a replay: its parts add up to the allocated GPU-time, and each part moves with its cause."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suanli.sched import POLICIES, SchedulerConfig
from suanli.sim import SimConfig, TraceJob, simulate
from suanli.sim.synthetic import synthetic_jobs
from suanli.topology import load_preset

PARTS = ("work_gpu_h", "slowdown_gpu_h", "elastic_gpu_h", "preemption_gpu_h", "failure_gpu_h", "resize_gpu_h")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), policy=st.sampled_from([*POLICIES, "oracle-srsf"]), failures=st.booleans())
def test_parts_add_up_to_the_allocated_gpu_time(seed: int, policy: str, failures: bool) -> None:
    jobs = [j for j in synthetic_jobs(60, seed) if j.num_gpus <= 32]
    cfg = SimConfig(scheduler=SchedulerConfig(policy=policy), node_mtbf_h=300.0 if failures else None, seed=seed)
    r = simulate(jobs, load_preset("4x8:H100"), cfg)
    allocated = r.utilization * r.makespan_s * 32 / 3600
    assert sum(getattr(r, k) for k in PARTS) == pytest.approx(allocated, rel=1e-6, abs=1e-6)
    assert r.work_gpu_h == pytest.approx(sum(j.gpu_seconds for j in jobs) / 3600, rel=1e-9)
    assert r.slowdown_gpu_h == pytest.approx(sum(r.slowdown_by_size.values()))
    assert min(r.slowdown_gpu_h, r.preemption_gpu_h, r.idle_queued_gpu_h, r.requeued_gpu_h) >= 0
    if not failures:
        assert r.failure_gpu_h == 0


def test_a_preemption_costs_the_restart_of_the_victims_gpus() -> None:
    jobs = [TraceJob("long", 0.0, 8, 10_000.0), TraceJob("short", 100.0, 8, 50.0)]
    r = simulate(jobs, load_preset("1x8:H100"), SimConfig(scheduler=SchedulerConfig(policy="oracle-srsf")))
    assert r.preemptions == 1
    assert r.preemption_gpu_h == pytest.approx(8 * 60.0 / 3600)
    assert r.requeued_gpu_h == pytest.approx(8 * 50.0 / 3600)  # the victim's 8 GPUs asked for while it waited


def test_a_split_gang_shows_as_slowdown_of_its_size() -> None:
    """First-fit puts a 6-GPU job on node 0, the next one on its last 2 GPUs and 4 of node 1: a split 6-GPU gang."""
    c = load_preset("2x8:H100")
    jobs = [TraceJob("a", 0.0, 6, 1000.0), TraceJob("b", 0.0, 6, 1000.0), TraceJob("c", 1.0, 4, 1000.0)]
    jobs = [replace(j, model=None) for j in jobs]
    r = simulate(jobs, c, SimConfig(scheduler=SchedulerConfig(policy="fifo")))
    assert r.avg_placement_slowdown > 1.0
    assert set(r.slowdown_by_size) == {"5-8"} and r.slowdown_gpu_h > 0
