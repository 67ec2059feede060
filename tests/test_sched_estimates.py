"""Runtime estimates from history, and the orderings that read them: robust to bad estimates, never clairvoyant."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.sched import Request
from suanli.sched.estimates import RuntimeHistory
from suanli.sched.policies import est_left, expected_left
from suanli.sim import SimConfig, TraceJob
from suanli.sim.engine import Simulation
from suanli.topology import load_preset


def test_history_falls_back_to_coarser_groups() -> None:
    h = RuntimeHistory(min_samples=2)
    assert h.estimate("a", "m", 1) is None
    h.record("a", "m", 1, 100.0)
    assert h.estimate("a", "m", 1) is None  # one sample says nothing
    h.record("a", "m", 4, 300.0)
    assert h.estimate("a", "m", 1) == 200.0  # the tenant's model, any size
    h.record("a", "m", 1, 50.0)
    assert h.estimate("a", "m", 1) == 75.0  # its own group now
    assert h.estimate("b", None, 8) == 100.0  # another tenant: everyone's
    assert h.estimate("a", "m", 1, declared=10.0) == 10.0
    assert h.estimate("a", "m", 1, limit=60.0) == 60.0


def test_history_ignores_nonsense_and_keeps_a_window() -> None:
    h = RuntimeHistory(window=3, min_samples=1)
    for v in (-1.0, math.nan, 1.0, 2.0, 3.0, 400.0):
        h.record("a", None, 1, v)
    assert h.samples("a", None, 1) == (2.0, 3.0, 400.0)


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(st.floats(1, 1e6), min_size=1, max_size=20).map(lambda v: tuple(sorted(v))),
    ran=st.floats(0, 2e6),
)
def test_expected_left_is_positive_and_outrunning_means_long(samples: tuple[float, ...], ran: float) -> None:
    left = expected_left(samples, ran)
    assert left >= 0
    if ran >= samples[-1]:
        assert left == ran  # outran all of them: as long again, never nearly done


@settings(max_examples=200, deadline=None)
@given(est=st.floats(1, 1e6), had=st.floats(0, 1e7), gpus=st.integers(1, 64))
def test_a_job_past_its_estimate_is_not_nearly_done(est: float, had: float, gpus: int) -> None:
    r = Request("x", gpus, 0.0, est_runtime=est, attained=had)
    left = est_left(r)
    assert left >= 0
    if had >= est * gpus:
        assert left == had


def test_the_simulator_estimates_from_finished_work_only() -> None:
    """No clairvoyance: a job's estimate at arrival is built from jobs that finished before it arrived."""
    jobs = [TraceJob(f"j{i}", 1000.0 * i, 1, 100.0 + i) for i in range(6)]
    jobs.append(TraceJob("late", 6000.0, 1, 99999.0))
    sim = Simulation(jobs, load_preset("1x8:H100"), SimConfig())
    sim.run()
    assert sim.requests[0].est_runtime is None and sim.requests[2].est_runtime is None
    assert sim.requests[3].est_runtime == pytest.approx(101.0)  # median of 100, 101, 102
    assert sim.requests[6].est_runtime == pytest.approx(102.5)  # the last job's own duration is unknown to it
    exact = Simulation(jobs, load_preset("1x8:H100"), SimConfig(estimates="exact"))
    assert exact.requests[6].est_runtime == 99999.0
