"""Health rules (tables at each boundary) and the simulated collector (properties of its physics and faults)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from suanli import catalog
from suanli.telemetry.health import Finding, HealthJudge, HealthRules, slowdown_c
from suanli.telemetry.samples import GpuSample
from suanli.telemetry.simulated import (
    COOLING_SPREAD,
    GPU_IDLE,
    HW_SLOWDOWN,
    HW_THERMAL,
    IDLE_MEM_MIB,
    LOST_ERROR,
    RISE_AT_TDP_C,
    Fault,
    Load,
    SimGpu,
    SimulatedCollector,
)

H100 = {("n1", 0): "H100-SXM"}
MODELS = [g.name for g in catalog.all_gpus()]


def s(temp: float = 40.0, *, xid: int = 0, dbe: int = 0, error: str = "", gpu: int = 0, t: float = 0.0) -> GpuSample:
    return GpuSample("n1", gpu, f"GPU-{gpu}", t, temp_c=temp, ecc_dbe=dbe, xid=xid, error=error)


def run(judge: HealthJudge, samples: list[GpuSample], models: dict[tuple[str, int], str] = H100) -> list[list[str]]:
    """The rules that fired (fatal findings), sample by sample."""
    return [[f.rule for f in judge.judge([x], models) if f.fatal] for x in samples]


# --- health rules ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "temps", "fired"),
    [
        (HealthRules(), [89, 89], [[], ["overtemp"]]),  # H100-SXM slows down at 89 °C: two in a row
        (HealthRules(), [88.9, 89], [[], []]),
        (HealthRules(), [89, 88, 89], [[], [], []]),  # not consecutive
        (HealthRules(), [95, 95, 95], [[], ["overtemp"], ["overtemp"]]),  # level-triggered while it holds
        (HealthRules(overtemp_samples=1), [89], [["overtemp"]]),
        (HealthRules(overtemp_margin_c=2), [87, 87], [[], ["overtemp"]]),
        (HealthRules(overtemp_margin_c=2), [86.9, 86.9], [[], []]),
    ],
)
def test_overtemp_boundary(rules: HealthRules, temps: list[float], fired: list[list[str]]) -> None:
    assert run(HealthJudge(rules), [s(x) for x in temps]) == fired


def test_one_hot_spike_is_a_warning_only() -> None:
    judge = HealthJudge(HealthRules(overtemp_samples=3))
    out = [[(f.rule, f.fatal) for f in judge.judge([s(x)], H100)] for x in (95, 40, 95, 95, 95)]
    warn, fatal = ("overtemp", False), ("overtemp", True)
    assert out == [[warn], [], [warn], [warn], [fatal]]


@pytest.mark.parametrize(("model", "hot"), [("L40S", 90), ("no-such-gpu", 90), ("", 90), ("T4", 93), ("h100", 89)])
def test_overtemp_threshold_per_model(model: str, hot: float) -> None:
    judge = HealthJudge()
    assert run(judge, [s(hot - 0.5)] * 2, {("n1", 0): model}) == [[], []]
    assert run(judge, [s(hot)] * 2, {("n1", 0): model}) == [[], ["overtemp"]]


def test_slowdown_helper_and_reason_text() -> None:
    rules = HealthRules()
    assert slowdown_c("H100-SXM", rules) == 89 and slowdown_c("L40S", rules) == 90
    assert slowdown_c("nope", HealthRules(default_slowdown_c=80)) == 80
    assert run(HealthJudge(), [s(90)] * 2, {}) == [[], ["overtemp"]]  # a GPU without a model: the default
    warn, f = HealthJudge().judge([s(93, gpu=3)] * 2, {("n1", 3): "H100-SXM"})
    assert warn == Finding("n1", 3, "overtemp", "GPU 3 at 93 °C ≥ H100-SXM slowdown 89 °C for 1 of 2 samples", False)
    assert f == Finding("n1", 3, "overtemp", "GPU 3 at 93 °C ≥ H100-SXM slowdown 89 °C for 2 samples", True)
    (f,) = HealthJudge(HealthRules(overtemp_margin_c=2, overtemp_samples=1)).judge([s(88)], H100)
    assert f.reason == "GPU 0 at 88 °C ≥ 87 °C (H100-SXM slowdown 89 °C − 2) for 1 samples"


@pytest.mark.parametrize(
    ("rules", "xid", "fires"),
    [
        (HealthRules(), 79, True),
        (HealthRules(), 48, True),
        (HealthRules(), 74, True),
        (HealthRules(), 95, True),
        (HealthRules(), 13, False),  # application errors leave the GPU healthy
        (HealthRules(), 31, False),
        (HealthRules(), 43, False),
        (HealthRules(), 0, False),
        (HealthRules(fatal_xids=(13,)), 13, True),
        (HealthRules(fatal_xids=()), 79, False),
    ],
)
def test_xid(rules: HealthRules, xid: int, fires: bool) -> None:
    findings = HealthJudge(rules).judge([s(xid=xid)], H100)
    assert [f.rule for f in findings] == (["xid"] if fires else [])
    assert all(f.fatal and f"XID {xid}" in f.reason for f in findings)


@pytest.mark.parametrize(
    ("rules", "counts", "fired_at"),
    [
        (HealthRules(), [0, 0, 1, 1, 2], [2, 4]),  # each increase, once
        (HealthRules(), [3, 3], [0]),  # a non-zero volatile count on first sight: a DBE since the last reset
        (HealthRules(), [2, 0, 0, 1], [0, 3]),  # a reset zeroes the counter: a new baseline, not an event
        (HealthRules(ecc_dbe=False), [0, 1, 2], []),
    ],
)
def test_ecc_dbe_fires_on_increase_only(rules: HealthRules, counts: list[int], fired_at: list[int]) -> None:
    fired = run(HealthJudge(rules), [s(dbe=c) for c in counts])
    assert [i for i, rules_ in enumerate(fired) if rules_ == ["ecc_dbe"]] == fired_at
    assert all(r in ([], ["ecc_dbe"]) for r in fired)


def test_nvml_error_marks_the_gpu_and_keeps_its_xid() -> None:
    judge = HealthJudge()
    findings = judge.judge([s(error="GPU is lost", xid=79), s(40, gpu=1)], {})
    assert [(f.gpu, f.rule, f.fatal) for f in findings] == [(0, "nvml_error", True), (0, "xid", True)]
    assert findings[0].reason == "GPU 0 unreadable: GPU is lost"
    assert HealthJudge(HealthRules(nvml_errors=False)).judge([s(error="GPU is lost")], {}) == []
    # An unreadable sample says nothing about temperature: it neither counts as hot nor breaks a hot streak.
    assert run(judge, [s(95), s(error="x"), s(95)]) == [[], ["nvml_error"], ["overtemp"]]


@pytest.mark.parametrize(("age", "fires"), [(0.0, False), (60.0, False), (60.001, True), (3600.0, True)])
def test_heartbeat_boundary(age: float, fires: bool) -> None:
    findings = HealthJudge().heartbeats({"n1": 1000.0, "n2": 1000.0 + age}, now=1000.0 + age)
    assert [(f.node, f.gpu, f.rule, f.fatal) for f in findings] == ([("n1", None, "heartbeat", True)] if fires else [])


def test_rules_are_strict_and_frozen() -> None:
    with pytest.raises(ValidationError):
        HealthRules(overtemp_sample=3)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        HealthRules(overtemp_samples=0)
    with pytest.raises(ValidationError):
        HealthRules().overtemp_samples = 3  # type: ignore[misc]


def test_forget_drops_the_memory_of_a_node() -> None:
    judge = HealthJudge()
    run(judge, [s(95), s(dbe=1)])
    judge.forget("n1")
    assert run(judge, [s(95), s(dbe=1)]) == [[], ["ecc_dbe"]]


# --- simulated collector --------------------------------------------------------------------------------------


def node(n: int = 4, model: str = "H100-SXM", name: str = "n1") -> list[SimGpu]:
    return [SimGpu(name, i, f"GPU-{name}-{i}", model) for i in range(n)]


def series(
    c: SimulatedCollector, gpus: list[SimGpu], loads: dict, steps: int, dt: float = 10.0, faults: list[Fault] = ()
) -> list[list[GpuSample]]:
    return [c.sample(gpus, loads, list(faults), 1000.0 + k * dt) for k in range(steps)]


loads_st = st.dictionaries(
    st.tuples(st.just("n1"), st.integers(0, 3)),
    st.builds(Load, st.floats(0, 1), st.floats(0, 1)),
    max_size=4,
)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), loads=loads_st, model=st.sampled_from(MODELS))
def test_same_seed_same_samples(seed: int, loads: dict, model: str) -> None:
    gpus = node(4, model)
    faults = [Fault("overtemp", "n1", 1), Fault("xid", "n1", 2, xid=63)]
    runs = [series(SimulatedCollector(seed, fault_rate_per_gpu_hour=50), gpus, loads, 6, faults=faults) for _ in "ab"]
    assert runs[0] == runs[1]


def test_different_seeds_differ_under_load() -> None:
    loads = {("n1", 0): Load(0.7, 0.5)}
    a, b = (series(SimulatedCollector(seed), node(1), loads, 5) for seed in (1, 2))
    assert a != b


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 1000),
    ambient=st.floats(0, 45),
    model=st.sampled_from(MODELS),
    loads=loads_st,
    gaps=st.lists(st.floats(0, 600), min_size=1, max_size=12),
    hot=st.booleans(),
)
def test_temperature_stays_physical(
    seed: int, ambient: float, model: str, loads: dict, gaps: list[float], hot: bool
) -> None:
    spec = catalog.gpu(model)
    shutdown = spec.thermal.shutdown_C if spec.thermal else 95.0
    c, gpus, t = SimulatedCollector(seed, ambient_c=ambient), node(4, model), 0.0
    for gap in gaps:
        t += gap
        for x in c.sample(gpus, loads, [Fault("overtemp", "n1", 0)] if hot else [], t):
            assert ambient - 0.5 <= x.temp_c < shutdown  # hardware slowdown keeps it from shutting down
            assert x.temp_c <= max(ambient + RISE_AT_TDP_C, shutdown) + 0.5
            assert 0 <= x.util <= 100 and 0 < x.power_w <= x.power_limit_w == spec.tdp_W
            assert 0 < x.mem_used_mib < x.mem_total_mib


@settings(max_examples=30, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    busy=st.floats(0.05, 1),
    compute=st.floats(0, 1),
    ambient=st.floats(10, 35),
    dt=st.floats(1, 60),
)
def test_temperature_rises_monotonically_to_steady_state(
    model: str, busy: float, compute: float, ambient: float, dt: float
) -> None:
    c, gpus = SimulatedCollector(7, ambient_c=ambient), node(1, model)
    temps = [x[0].temp_c for x in series(c, gpus, {("n1", 0): Load(busy, compute)}, int(600 / dt) + 2, dt)]
    assert temps == sorted(temps)
    assert temps[0] < temps[-1] or busy < 0.1
    tdp = catalog.gpu(model).tdp_W
    mean_power = 0.12 * tdp + 0.88 * tdp * min(busy * (0.4 + 0.6 * compute) * 1.08, 1)
    lo, hi = (ambient + RISE_AT_TDP_C * f * mean_power / tdp for f in COOLING_SPREAD)  # this GPU's cooling
    assert lo - 1.0 <= temps[-1] <= hi + 1.0


def test_idle_gpu_reads_idle() -> None:
    for samples in series(SimulatedCollector(3), node(2), {("n1", 1): Load(0.0, 1.0)}, 4):
        for x in samples:
            assert x.util == 0 and x.throttle & GPU_IDLE and x.xid == 0 and x.error == ""
            assert x.power_w < 0.15 * x.power_limit_w
        assert samples[0].mem_used_mib == IDLE_MEM_MIB  # unallocated
        assert samples[1].mem_used_mib > 0.7 * samples[1].mem_total_mib  # allocated, idle: its memory is held


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("busy", [0.0, 1.0])
def test_overtemp_fault_crosses_slowdown_and_the_judge_reports_it(model: str, busy: float) -> None:
    c, gpus, judge = SimulatedCollector(11), node(2, model), HealthJudge()
    models = {("n1", i): model for i in range(2)}
    loads = {("n1", i): Load(busy) for i in range(2)}
    threshold = slowdown_c(model, judge.rules)
    series(c, gpus, loads, 3)  # a settled start
    fault = [Fault("overtemp", "n1", 1)]
    crossed = reported = None
    for k in range(12):
        samples = c.sample(gpus, loads, fault, 1030.0 + 10 * k)
        findings = [f for f in judge.judge(samples, models) if f.fatal]
        assert all(f.gpu == 1 for f in findings) and samples[0].temp_c < threshold
        if crossed is None and samples[1].temp_c >= threshold:
            crossed = k
            assert samples[1].throttle & (HW_SLOWDOWN | HW_THERMAL)
        if reported is None and findings:
            reported = k
            assert [f.rule for f in findings] == ["overtemp"]
    assert crossed is not None and crossed <= 8  # within 80 s, even from idle
    assert reported == crossed + judge.rules.overtemp_samples - 1
    cooled = series(c, gpus, loads, 12)  # fault cleared: the fan works again
    assert cooled[-1][1].temp_c < threshold and judge.judge(cooled[-1], models) == []


def test_injected_xid_is_reported_exactly_once() -> None:
    c, gpus = SimulatedCollector(5), node(2)
    fault = Fault("xid", "n1", 1, xid=79)
    plan = [[], [fault], [fault], [fault], [], [fault]]  # still passed: no repeat; passed again after a gap: again
    xids = [[x.xid for x in c.sample(gpus, {}, f, 10.0 * k)] for k, f in enumerate(plan)]
    assert xids == [[0, 0], [0, 79], [0, 0], [0, 0], [0, 0], [0, 79]]


def test_one_shot_faults_are_tracked_per_gpu_across_partial_calls() -> None:
    """A caller sampling its nodes in several calls must not see a still-listed XID again."""
    c, a, b = SimulatedCollector(5), node(1, name="a"), node(1, name="b")
    fault = [Fault("xid", "a", 0, xid=48)]
    xids = [c.sample(gpus, {}, fault, 10.0 * k)[0].xid for k, gpus in enumerate([a, b, a, b, a])]
    assert xids == [48, 0, 0, 0, 0]


def test_injected_dbe_raises_the_counter_once() -> None:
    c, gpus, judge = SimulatedCollector(5), node(1), HealthJudge()
    fault = [Fault("ecc_dbe", "n1", 0)]
    counts, rules = [], []
    for k, f in enumerate([[], fault, fault, []]):
        samples = c.sample(gpus, {}, f, 10.0 * k)
        counts.append(samples[0].ecc_dbe)
        rules.append([x.rule for x in judge.judge(samples, {})])
    assert counts == [0, 1, 1, 1] and rules == [[], ["ecc_dbe"], [], []]


def test_off_bus_gives_error_samples_until_cleared() -> None:
    c, gpus = SimulatedCollector(5), node(2)
    lost = [Fault("off_bus", "n1", 0)]
    out = [c.sample(gpus, {("n1", 0): Load(1.0)}, f, 10.0 * k) for k, f in enumerate([[], lost, lost, []])]
    assert [x[0].error for x in out] == ["", LOST_ERROR, LOST_ERROR, ""]
    assert [x[0].xid for x in out] == [0, 79, 0, 0]
    assert all(x[1].error == "" for x in out)
    assert out[1][0].util == 0 and out[1][0].uuid == "GPU-n1-0" and out[3][0].util > 0


def test_silent_gpus_send_nothing_and_their_node_times_out() -> None:
    c, gpus = SimulatedCollector(5), node(2) + node(1, name="n2")
    samples = c.sample(gpus, {}, [Fault("silent", "n2", 0)], 100.0)
    assert {(x.node, x.gpu) for x in samples} == {("n1", 0), ("n1", 1)}
    last = {"n1": 100.0, "n2": 20.0}
    assert [f.node for f in HealthJudge().heartbeats(last, 100.0)] == ["n2"]


def test_random_faults_follow_the_rate() -> None:
    gpus = node(8, name="a") + node(8, name="b")
    assert not any(x.xid for k in series(SimulatedCollector(1), gpus, {}, 50, dt=3600) for x in k)
    noisy = series(SimulatedCollector(1, fault_rate_per_gpu_hour=0.5), gpus, {}, 50, dt=3600)
    xids = [x.xid for k in noisy for x in k if x.xid]
    assert 0.2 * 400 < len(xids) < 0.6 * 800  # P(fault in an hour) = 1 - e^-0.5 ≈ 0.39 of 800 GPU-hours
    assert set(xids) <= {13, 31, 43, 48, 63, 74, 94}
    assert noisy[-1][0].ecc_dbe == sum(1 for k in noisy if k[0].xid in (48, 94))


def test_ten_thousand_gpus_in_one_call() -> None:
    models = ["H100-SXM", "A100-SXM-80G", "L40S", "B200"]
    gpus = [SimGpu(f"n{i // 8}", i % 8, f"GPU-{i}", models[i % 4]) for i in range(10_000)]
    loads = {(g.node, g.gpu): Load(0.9, 0.8) for g in gpus[::2]}
    c = SimulatedCollector(0, fault_rate_per_gpu_hour=1.0)
    c.sample(gpus, loads, [], 0.0)
    samples = c.sample(gpus, loads, [Fault("off_bus", "n3", 2)], 30.0)
    assert len(samples) == 10_000 and [(x.node, x.gpu) for x in samples] == [(g.node, g.gpu) for g in gpus]
    assert sum(1 for x in samples if x.error) == 1
    assert all(x.util > 50 for x in samples[::2] if not x.error) and all(x.util == 0 for x in samples[1::2])
    findings = HealthJudge().judge(samples, {(g.node, g.gpu): g.model for g in gpus})
    assert ("n3", 2, "nvml_error") in {(f.node, f.gpu, f.rule) for f in findings}


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        SimulatedCollector(0).sample(node(1) * 2, {}, [], 0.0)
    with pytest.raises(catalog.CatalogError):
        SimulatedCollector(0).sample([SimGpu("n", 0, "u", "GTX-1080")], {}, [], 0.0)
    with pytest.raises(ValueError, match="ambient"):
        SimulatedCollector(0, ambient_c=90)
