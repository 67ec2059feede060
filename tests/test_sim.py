"""Trace-driven simulator: job conservation, unschedulable work, determinism, topology cost, failures, metrics.

Every replay is small (a 4 x 8 GPU cluster, 150 jobs at most) so the whole file runs in seconds.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from suanli.sched import POLICIES, SchedulerConfig
from suanli.sim import RuntimeModel, SimConfig, SimResult, Simulation, TraceJob, simulate
from suanli.sim.synthetic import synthetic_jobs
from suanli.topology import Cluster, load_preset, parse

WALL_FIELDS = ("replay_wall_s", "decision_p50_ms", "decision_p99_ms")


def small() -> Cluster:
    return load_preset("4x8:H100")


def oversubscribed(leaf_oversubscription: float = 2.0) -> Cluster:
    """8 nodes x 8 H100, 2 nodes per leaf (4 leaves), leaf uplinks oversubscribed."""
    return parse(
        {
            "name": "os",
            "node_groups": [{"name": "n", "count": 8, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8}],
            "fabric": "ib-ndr",
            "nodes_per_leaf": 2,
            "leaf_oversubscription": leaf_oversubscription,
        }
    )


def mixed_trace(n: int = 150, seed: int = 1) -> list[TraceJob]:
    """Synthetic jobs (sizes up to 64: some bigger than the small cluster), a few of them GPU slices."""
    jobs = synthetic_jobs(n, seed)
    out = []
    for i, j in enumerate(jobs):
        if j.num_gpus == 1 and i % 5 == 0:
            j = replace(j, gpu_fraction=(0.25, 0.5, 0.75)[i % 3])
        out.append(j)
    return out


def config(policy: str, **kw: object) -> SimConfig:
    placement = kw.pop("placement", None)
    return SimConfig(scheduler=SchedulerConfig(policy=policy, placement=placement), **kw)  # type: ignore[arg-type]


class _Bounded(Simulation):
    """A simulation that stops (raises) instead of spinning forever on failure/repair events."""

    MAX_FAILURES = 5_000

    def _fail(self, node: int, t: float) -> None:
        if self.metrics.failures >= self.MAX_FAILURES:
            raise AssertionError(
                f"simulation does not terminate: {self.metrics.failures} node failures by t={t / 3600:.0f} h, "
                f"queue {sorted(self.queue)}, running {sorted(self.running)}"
            )
        super()._fail(node, t)


def replay(jobs: list[TraceJob], cluster: Cluster, cfg: SimConfig) -> tuple[SimResult, Simulation]:
    sim = _Bounded(jobs, cluster, cfg)
    return sim.run(), sim


def assert_conserved(r: SimResult, n: int) -> None:
    assert r.jobs == n
    assert r.finished + r.queued + r.running + r.unschedulable == r.jobs, r.summary()


def comparable(r: SimResult) -> dict:
    return {k: v for k, v in r.summary().items() if k not in WALL_FIELDS}


# --- conservation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_conserves_and_finishes_jobs(policy: str) -> None:
    jobs = mixed_trace()
    r, sim = replay(jobs, small(), config(policy))
    assert_conserved(r, len(jobs))
    too_big = sum(j.num_gpus > 32 for j in jobs)
    assert too_big >= 1  # the trace exercises the unschedulable path
    assert r.unschedulable == too_big
    assert r.finished == r.jobs - r.unschedulable
    assert r.queued == 0 and r.running == 0
    assert not sim.state.allocations  # every GPU given back
    assert sim.state.free_whole_gpus() == 32
    for rec, job in zip(sim.records, jobs, strict=True):
        if rec.unschedulable:
            assert rec.finish is None and rec.first_start is None
        else:
            assert rec.first_start is not None and rec.finish is not None
            assert job.submit_time_s <= rec.first_start <= rec.finish
    assert len(r.jct_samples) == r.finished


def test_job_bigger_than_the_cluster_is_unschedulable_not_lost() -> None:
    jobs = [
        TraceJob("a", 0.0, 4, 100.0),
        TraceJob("huge", 5.0, 33, 100.0),
        TraceJob("b", 10.0, 32, 100.0),
        TraceJob("c", 20.0, 1, 100.0),
    ]
    r, sim = replay(jobs, small(), config("default"))
    assert r.unschedulable == 1
    assert r.finished == 3
    assert_conserved(r, 4)
    assert sim.records[1].unschedulable and sim.records[1].finish is None


def _hetero() -> Cluster:
    return parse(
        {
            "name": "het",
            "node_groups": [
                {"name": "h100", "count": 3, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8},
                {"name": "a100", "count": 1, "gpu": "A100-SXM-80G", "gpus_per_node": 8, "nics": 8},
            ],
            "fabric": "ib-ndr",
        }
    )


def test_typed_jobs_run_on_their_gpu_type() -> None:
    jobs = [TraceJob(f"a{i}", float(i), 4, 100.0, gpu_type="A100-SXM-80G") for i in range(4)]
    r, sim = replay(jobs, _hetero(), config("default"))
    assert r.finished == 4
    assert_conserved(r, 4)
    # two at a time on the one 8-GPU A100 node: the last two wait for the first two
    starts = sorted(rec.first_start for rec in sim.records)  # type: ignore[type-var]
    assert starts[2] >= 100.0


def test_job_bigger_than_its_gpu_type_pool_is_unschedulable() -> None:
    """16 A100 asked on a cluster with 8 A100 (and 24 H100): it can never run.

    The simulator only compares num_gpus with the whole cluster (32), so the job sits in the queue for
    ever: it is reported as queued, not unschedulable, and it counts every idle GPU as waste.
    """
    jobs = [TraceJob("a", 0.0, 2, 100.0), TraceJob("big-a100", 1.0, 16, 100.0, gpu_type="A100-SXM-80G")]
    r, _ = replay(jobs, _hetero(), config("default"))
    assert_conserved(r, 2)
    assert r.finished == 1
    assert r.unschedulable == 1, r.summary()
    assert r.queued == 0


def test_simulation_with_failures_terminates_when_a_job_can_never_run() -> None:
    """With node failures on, the replay loop stops only once the queue is empty; a job that can never be
    placed keeps it non-empty, so failure/repair events are replayed for ever (an endless loop)."""
    jobs = [TraceJob("a", 0.0, 2, 100.0), TraceJob("big-a100", 1.0, 16, 100.0, gpu_type="A100-SXM-80G")]
    r, _ = replay(jobs, _hetero(), config("default", node_mtbf_h=2.0, mttr_h=0.5))
    assert_conserved(r, 2)
    assert r.finished == 1


def test_empty_trace() -> None:
    r, _ = replay([], small(), config("default"))
    assert r.jobs == r.finished == r.unschedulable == 0
    assert_conserved(r, 0)


# --- determinism --------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["default", "las", "elastic", "fair-share"])
def test_deterministic(policy: str) -> None:
    jobs = mixed_trace(120, seed=7)
    cfg = config(policy, node_mtbf_h=4.0, mttr_h=0.5, seed=3)
    ticks = iter(range(10**9))
    r1 = simulate(jobs, small(), cfg, clock=lambda: float(next(ticks)))  # a clock changes only wall fields
    r2 = simulate(jobs, small(), cfg)
    assert comparable(r1) == comparable(r2)
    assert r1.jct_samples == r2.jct_samples
    assert r1.timeline == r2.timeline
    assert r1.decision_p50_ms > 0 and r1.replay_wall_s > 0  # the injected clock was used
    assert r2.replay_wall_s == 0.0
    # a different failure seed gives a different replay
    r3 = simulate(jobs, small(), replace(cfg, seed=4))
    assert comparable(r3) != comparable(r1)


def test_input_jobs_are_not_changed() -> None:
    jobs = mixed_trace(60)
    before = list(jobs)
    simulate(jobs, small(), config("default", node_mtbf_h=3.0, mttr_h=0.5))
    assert jobs == before


# --- topology -----------------------------------------------------------------------------------------


def test_runtime_slowdown_from_topology() -> None:
    c = oversubscribed()
    rm = RuntimeModel(c)
    assert rm.slowdown(np.array([3])) == 1.0
    assert rm.slowdown(np.arange(8)) == 1.0  # one node
    assert rm.slowdown(np.array([0, 2, 5])) == 1.0
    assert rm.slowdown(np.arange(16)) == pytest.approx(1.0)  # two nodes of one leaf: the reference
    cross = np.r_[0:4, 16:20]  # 8 GPUs over two leaves (nodes 0 and 2)
    assert rm.slowdown(cross) > 1.0
    cross16 = np.r_[0:8, 16:24]
    assert rm.slowdown(cross16) > 1.0
    # the oversubscribed spine makes the cross-leaf gang slower than on a non-blocking fabric
    flat = RuntimeModel(oversubscribed(1.0))
    assert rm.slowdown(cross16) > flat.slowdown(cross16) >= 1.0
    # never faster than compact, bounded by the communication share
    for gpus in (cross, cross16, np.r_[0:2, 20:22, 40:44]):
        s = rm.slowdown(gpus)
        assert 1.0 <= s <= 1.0 + rm.comm_fraction * 1e3
    # a model preset changes the gradient size, not the single-node rule
    assert rm.slowdown(np.arange(8), "llama3-8b") == 1.0


def _multi_node_trace() -> list[TraceJob]:
    return synthetic_jobs(120, 3, gpu_sizes=(1, 4, 8, 16), size_weights=(0.4, 0.2, 0.2, 0.2), mean_interarrival_s=120)


@pytest.mark.parametrize("policy", ["fifo-backfill", "default"])
def test_topology_placement_beats_first_fit_on_an_oversubscribed_fabric(policy: str) -> None:
    jobs = _multi_node_trace()
    c = oversubscribed()
    ff = simulate(jobs, c, config(policy, placement="first-fit"))
    topo = simulate(jobs, c, config(policy, placement="topology"))
    for r in (ff, topo):
        assert_conserved(r, len(jobs))
        assert r.finished == len(jobs)
    assert ff.avg_placement_slowdown > 1.0
    assert topo.avg_placement_slowdown <= ff.avg_placement_slowdown
    assert topo.useful_utilization <= topo.utilization + 1e-12


def test_single_node_jobs_have_no_placement_slowdown() -> None:
    """Whole-node jobs alone (nodes are either empty or full) and 1-GPU jobs alone never span nodes."""
    for sizes in ((8,), (1,)):
        jobs = synthetic_jobs(80, 5, gpu_sizes=sizes, mean_interarrival_s=60, elastic_fraction=0.0)
        for placement in ("first-fit", "topology"):
            r = simulate(jobs, oversubscribed(), config("fifo-backfill", placement=placement))
            assert r.finished == len(jobs)
            assert r.avg_placement_slowdown == 1.0, (sizes, placement)
            assert r.useful_utilization == pytest.approx(r.utilization)


# --- failures -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["default", "fifo", "elastic", "las"])
def test_failures_are_survived(policy: str) -> None:
    jobs = mixed_trace(150, seed=2)
    r, sim = replay(jobs, small(), config(policy, node_mtbf_h=2.0, mttr_h=0.5, seed=1))
    assert r.failures > 0
    assert_conserved(r, len(jobs))
    assert r.finished == r.jobs - r.unschedulable
    hit = sum(rec.failures for rec in sim.records)
    assert hit > 0
    assert r.preemptions == sum(rec.preemptions for rec in sim.records)  # failures are not preemptions
    if policy == "fifo":
        assert r.preemptions == 0  # fifo never preempts, however many nodes fail
    assert not sim.state.allocations
    for req, rec in zip(sim.requests, sim.records, strict=True):  # waiting counts from the last time it was put back
        if rec.failures or rec.preemptions:
            assert req.queued_since is not None and req.queued_since >= rec.first_start
        else:
            assert req.queued_since is None


def test_failures_slow_the_workload_down() -> None:
    jobs = mixed_trace(150, seed=2)
    calm = simulate(jobs, small(), config("default"))
    stormy = simulate(jobs, small(), config("default", node_mtbf_h=2.0, mttr_h=0.5, seed=1))
    assert calm.failures == 0
    assert stormy.avg_jct_s > calm.avg_jct_s


# --- metrics ---------------------------------------------------------------------------------------------


def _check_ranges(r: SimResult) -> None:
    assert 0.0 <= r.utilization <= 1.0 + 1e-9
    assert 0.0 <= r.useful_utilization <= r.utilization + 1e-9
    assert 0.0 <= r.waste_fraction <= 1.0 + 1e-9
    assert 0.0 <= r.fragmentation <= r.waste_fraction + 1e-9
    assert 0.0 < r.jain_fairness <= 1.0 + 1e-12
    assert r.p50_jct_s <= r.p95_jct_s <= r.p99_jct_s
    assert r.avg_queue_s >= 0.0
    assert r.makespan_s > 0.0
    assert r.avg_placement_slowdown >= 1.0
    assert r.worst_tenant_slowdown > 0.0
    assert r.preemptions >= 0 and r.failures >= 0
    for v in r.summary().values():
        if isinstance(v, float):
            assert math.isfinite(v)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_metric_ranges(policy: str) -> None:
    r = simulate(mixed_trace(), small(), config(policy))
    _check_ranges(r)
    assert r.utilization > 0.0
    t = r.timeline
    assert len(t["t"]) == len(t["allocated"]) == len(t["queue"]) > 0
    assert all(0.0 <= a <= 32.0 + 1e-9 for a in t["allocated"])
    assert t["t"] == sorted(t["t"])


def test_metrics_when_everything_fits_at_once() -> None:
    """Tiny jobs on a big cluster: nobody waits, nothing is wasted."""
    at_once = [TraceJob(f"j{i}", 0.0, 1, 100.0 + i, tenant=f"t{i % 3}") for i in range(20)]
    spread = [TraceJob(f"k{i}", 30.0 * i, 1 + i % 2, 50.0, tenant=f"t{i % 2}") for i in range(40)]
    for jobs in (at_once, spread):
        for policy in POLICIES:
            r = simulate(jobs, small(), config(policy))
            assert r.finished == len(jobs), policy
            assert r.avg_queue_s == 0.0, policy
            assert r.waste_fraction == 0.0, policy
            assert r.fragmentation == 0.0, policy
            assert r.preemptions == 0, policy
            assert r.avg_placement_slowdown == 1.0
            _check_ranges(r)
    # exact values for the batch: JCT = duration, one tenant's slowdown is 1, fairness is perfect
    r = simulate(at_once, small(), config("default"))
    assert r.avg_jct_s == pytest.approx(np.mean([100.0 + i for i in range(20)]))
    assert r.makespan_s == pytest.approx(119.0)
    assert r.jain_fairness == pytest.approx(1.0)
    assert r.worst_tenant_slowdown == pytest.approx(1.0)
    gpu_s = sum(100.0 + i for i in range(20))
    assert r.utilization == pytest.approx(gpu_s / (32 * 119.0))


def test_fifo_head_of_line_blocking_wastes_more_than_backfill() -> None:
    """A long 1-GPU job runs; then a whole-cluster job arrives and 100 1-GPU jobs queue behind it.

    fifo idles 31 GPUs for ~2000 s behind the big job; backfill and the default policy run the small jobs
    (they end before the big job's reservation) meanwhile.
    """
    jobs = [
        TraceJob("long", 0.0, 1, 2000.0),
        TraceJob("whole", 1.0, 32, 100.0),
        *(TraceJob(f"s{i}", 2.0 + i, 1, 300.0) for i in range(100)),
    ]
    # runtimes as declared (the spec's duration): EASY backfill needs them; history knows nothing yet
    res = {p: simulate(jobs, small(), config(p, estimates="exact")) for p in ("fifo", "fifo-backfill", "default")}
    for r in res.values():
        assert r.finished == len(jobs)
        _check_ranges(r)
    assert res["fifo"].waste_fraction > res["fifo-backfill"].waste_fraction
    assert res["fifo"].waste_fraction > res["default"].waste_fraction
    assert res["fifo"].avg_queue_s > res["fifo-backfill"].avg_queue_s
    # backfill does not delay the big job: it still starts when the long job ends
    sim = Simulation(jobs, small(), config("fifo-backfill", estimates="exact"))
    sim.run()
    assert sim.records[1].first_start == pytest.approx(2000.0)


def test_elastic_jobs_use_idle_gpus() -> None:
    """One elastic job alone on the cluster: the elastic policy grows it, so it finishes sooner than a
    policy that keeps it at the size it asked for."""
    jobs = [TraceJob("e", 0.0, 4, 3600.0, min_gpus=1, max_gpus=16)]
    fixed = simulate(jobs, small(), config("fifo-backfill"))
    grown, sim = replay(jobs, small(), config("elastic"))
    assert fixed.avg_jct_s == pytest.approx(3600.0)
    assert grown.finished == 1
    assert grown.avg_jct_s < fixed.avg_jct_s
    assert sim.records[0].slowdowns  # started (and restarted on resizes) with recorded slowdowns


def test_jobs_wait_for_host_cores_on_a_cluster_that_states_them() -> None:
    """One node of 8 GPUs and 32 cores: two 2-GPU jobs asking 24 cores each run one after the other although
    their GPUs would fit together; on the same cluster without stated cores they run together."""
    jobs = [TraceJob(f"j{i}", 0.0, 2, 100.0, cpu_milli=24_000, memory_mib=1024) for i in range(2)]
    spec = {"name": "box", "node_groups": [{"name": "g", "count": 1, "gpu": "H100-SXM", "gpus_per_node": 8,
                                            "cpus": 32, "memory_gib": 64}]}  # fmt: skip
    stated = simulate(jobs, parse(spec), config("default"))
    del spec["node_groups"][0]["cpus"], spec["node_groups"][0]["memory_gib"]
    unstated = simulate(jobs, parse(spec), config("default"))
    assert stated.finished == unstated.finished == 2
    assert stated.makespan_s == pytest.approx(200.0) and unstated.makespan_s == pytest.approx(100.0)


def test_a_job_no_node_has_the_cores_for_is_unschedulable_not_stuck() -> None:
    spec = {"name": "box", "node_groups": [{"name": "g", "count": 2, "gpu": "H100-SXM", "gpus_per_node": 8,
                                            "cpus": 32}], "fabric": "ib-ndr"}  # fmt: skip
    jobs = [TraceJob("big", 0.0, 1, 100.0, cpu_milli=40_000), TraceJob("ok", 0.0, 2, 100.0, cpu_milli=40_000)]
    res = simulate(jobs, parse(spec), config("default"))
    assert (res.unschedulable, res.finished, res.queued) == (1, 1, 0)  # 2 GPUs with 40 cores: 20 on each node
