"""`oracle-srsf`, the simulator's clairvoyant reference: its order, its placement rule, its preemption cost, and that
nothing outside the simulator can run it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suanli.control.background import WorkloadLoop
from suanli.control.settings import Settings
from suanli.db.engine import Database
from suanli.sched import Scheduler, SchedulerConfig
from suanli.sim import SimConfig, Simulation, TraceJob, simulate
from suanli.sim.oracle import ORACLE_SRSF, OracleScheduler
from suanli.sim.synthetic import synthetic_jobs
from suanli.topology import load_preset

ORACLE = SimConfig(scheduler=SchedulerConfig(policy=ORACLE_SRSF))


class _Watched(Simulation):
    """Checks the oracle's placement rule on every state a cycle leads to."""

    def _cycle(self, t, clock):  # type: ignore[no-untyped-def]
        out = super()._cycle(t, clock)
        st_ = self.state
        gpn = int(st_.gpn.max())
        for a in st_.allocations.values():
            nodes = np.unique(st_.gpu_node[np.asarray(a.gpus)])
            if a.gpu_count <= gpn:
                assert nodes.size == 1, f"{a.id}: {a.gpu_count} GPUs split over {nodes.size} nodes"
            else:
                assert nodes.size == -(-a.gpu_count // gpn) and bool(st_.node_exclusive[nodes].all())
        return out


def test_shortest_remaining_service_first_on_one_node() -> None:
    jobs = [TraceJob("long", 0.0, 8, 300.0), TraceJob("short", 0.0, 8, 100.0), TraceJob("mid", 0.0, 8, 200.0)]
    sim = Simulation(jobs, load_preset("1x8:H100"), ORACLE)
    r = sim.run()
    assert [rec.finish for rec in sim.records] == [600.0, 100.0, 300.0]
    assert r.avg_jct_s == pytest.approx(1000 / 3)
    assert r.preemptions == 0


def test_a_shorter_arrival_preempts_and_the_victim_pays_the_restart() -> None:
    jobs = [TraceJob("long", 0.0, 8, 1000.0), TraceJob("short", 100.0, 8, 50.0)]
    sim = Simulation(jobs, load_preset("1x8:H100"), ORACLE)
    r = sim.run()
    assert r.preemptions == 1
    assert sim.records[1].finish == 150.0
    assert sim.records[0].finish == pytest.approx(1050.0 + ORACLE.restart_penalty_s)


def test_service_counts_gpus() -> None:
    """A 1-GPU job of 500 s has less service left than an 8-GPU job of 100 s: it goes first."""
    o = OracleScheduler([500.0, 100.0])
    from suanli.sched import Request

    a, b = Request("0", 1, 0.0), Request("1", 8, 0.0)
    assert o.service(a) < o.service(b)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), failures=st.booleans())
def test_every_job_finishes_and_small_gangs_stay_in_one_node(seed: int, failures: bool) -> None:
    jobs = [j for j in synthetic_jobs(60, seed) if j.num_gpus <= 32]
    jobs = [replace(j, gpu_fraction=0.5) if j.num_gpus == 1 and i % 7 == 0 else j for i, j in enumerate(jobs)]
    cfg = replace(ORACLE, node_mtbf_h=200.0 if failures else None, seed=seed)
    sim = _Watched(jobs, load_preset("4x8:H100"), cfg)
    r = sim.run()
    assert r.finished == len(jobs) and r.queued == 0 and r.running == 0
    assert not sim.state.allocations
    assert r.avg_placement_slowdown == pytest.approx(1.0)  # a small gang is never split; large ones take whole nodes


def test_oracle_beats_fifo_on_a_queued_trace() -> None:
    jobs = [j for j in synthetic_jobs(150, 3) if j.num_gpus <= 32]
    c = load_preset("4x8:H100")
    fifo = simulate(jobs, c, SimConfig(scheduler=SchedulerConfig(policy="fifo")))
    oracle = simulate(jobs, c, ORACLE)
    assert oracle.avg_jct_s < fifo.avg_jct_s


def test_the_server_refuses_the_oracle() -> None:
    with pytest.raises(ValueError, match="clairvoyant reference"):
        Settings(policy=ORACLE_SRSF)
    with pytest.raises(ValueError, match="unknown policy"):
        Scheduler(SchedulerConfig(policy=ORACLE_SRSF))
    with pytest.raises(ValueError, match="clairvoyant reference"):
        Settings(policy=f"{ORACLE_SRSF}+gittins")


def test_the_servers_policy_takes_switches_and_the_loop_runs_them(tmp_path: Path) -> None:
    s = Settings(policy="Default+grow_las+gittins", home=tmp_path)
    assert s.policy == "default+gittins+grow_las"  # normalised, switches in one order
    loop = WorkloadLoop(Database(f"sqlite:///{tmp_path / 'db.sqlite'}"), s)
    assert (loop.scheduling.config.policy, loop.scheduling.config.gittins, loop.scheduling.config.grow_las) == (
        "default", True, True)  # fmt: skip
    assert not loop.scheduling.config.elastic_shrink
    for bad in ("default+nope", "default+"):
        with pytest.raises(ValueError, match="unknown switch"):
            Settings(policy=bad)
