"""Training model: architecture presets, memory, step time, plan validation and plan search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.catalog import gpu
from suanli.perf import (
    MODEL_PRESETS,
    Placement,
    Plan,
    PlanError,
    TrainJob,
    candidate_plans,
    evaluate,
    memory_per_gpu,
    model_preset,
    search,
    step_time,
)
from suanli.topology import Cluster, load_preset, parse

H100 = gpu("H100-SXM")


def _cluster(gpu_name: str = "H100-SXM", nodes: int = 1, fabric: str | None = "ib-ndr", **kw: object) -> Cluster:
    spec: dict[str, object] = {
        "name": "t",
        "node_groups": [{"name": "n", "count": nodes, "gpu": gpu_name, "gpus_per_node": 8, "nics": 8}],
        **kw,
    }
    if fabric is not None:
        spec["fabric"] = fabric
    return parse(spec)


def _compact(cluster: Cluster, n: int) -> Placement:
    return Placement(cluster, cluster.compact_gpus(n))


@pytest.fixture(scope="module")
def superpod() -> Cluster:
    return load_preset("dgx-h100-superpod-su")


# --- architecture presets ------------------------------------------------------------------------------

PARAMS = [
    ("llama3.1-8b", 7.5e9, 8.5e9),
    ("llama3.1-70b", 69e9, 72e9),
    ("llama3.1-405b", 400e9, 410e9),
    ("llama2-70b", 68e9, 70e9),
    ("gpt3-175b", 170e9, 180e9),
    ("nemotron4-340b", 330e9, 345e9),
    ("qwen2.5-72b", 71e9, 74e9),
    ("nemotron4-15b", 14e9, 16.5e9),
    ("llama3.3-70b", 69e9, 72e9),
    ("nemotron-h-56b", 55e9, 58e9),
    ("deepseek-v3", 665e9, 675e9),
    ("deepseek-r1", 665e9, 675e9),
    ("kimi-k2", 1.0e12, 1.04e12),
    ("qwen3-235b-a22b", 233e9, 237e9),
    ("qwen3-30b-a3b", 30e9, 31e9),
    ("mixtral-8x7b", 46e9, 47.5e9),
    ("mixtral-8x22b", 139e9, 142e9),
    ("gpt-oss-120b", 115e9, 120e9),
    ("gpt-oss-20b", 20e9, 22e9),
    ("llama4-maverick", 395e9, 405e9),
    ("llama4-scout", 105e9, 110e9),
    ("grok-1", 310e9, 320e9),
]

# active parameters per token (model cards; embeddings included here, so a little above the cards' figure)
ACTIVE = [
    ("deepseek-v3", 36e9, 39e9),
    ("kimi-k2", 31e9, 34e9),
    ("qwen3-235b-a22b", 21e9, 23e9),
    ("qwen3-30b-a3b", 3e9, 3.6e9),
    ("mixtral-8x7b", 12.5e9, 13.2e9),
    ("mixtral-8x22b", 38e9, 40e9),
    ("gpt-oss-120b", 5.1e9, 6e9),
    ("llama4-maverick", 16.5e9, 18e9),
    ("llama4-scout", 16.5e9, 18e9),
]


@pytest.mark.parametrize(("name", "lo", "hi"), PARAMS)
def test_preset_parameter_counts(name: str, lo: float, hi: float) -> None:
    assert lo <= model_preset(name).params <= hi


@pytest.mark.parametrize(("name", "lo", "hi"), ACTIVE)
def test_moe_preset_active_parameters(name: str, lo: float, hi: float) -> None:
    assert lo <= model_preset(name).active_params <= hi


def test_stated_flops_of_dgxc_benchmarks() -> None:
    """dgxc-benchmarking states model FLOPs per 8192-token sample (causal attention) for Llama 4 Maverick
    (8.92e14), Grok-1 (4.27e15) and Nemotron-H 56B (2.816e15): the presets' shapes reproduce them."""
    for name, stated in (("llama4-maverick", 8.92e14), ("grok-1", 4.27e15), ("nemotron-h-56b", 2.816e15)):
        a = model_preset(name)
        flops = (a.linear_flops_per_token() + a.attention_flops_per_token(8192, causal=True)) * 8192
        assert flops == pytest.approx(stated, rel=0.02), name


def test_every_preset_has_a_parameter_range() -> None:
    assert {p[0] for p in PARAMS} == set(MODEL_PRESETS)


def test_llama70b_flops_match_nemo() -> None:
    """NeMo's performance tables use 3.94e15 FLOPs per 8192-token sequence of Llama 3.1 70B."""
    flops = model_preset("llama3.1-70b").model_flops_per_token(8192) * 8192
    assert flops == pytest.approx(3.94e15, rel=0.02)


def test_model_preset_lookup() -> None:
    assert model_preset("  LLaMA3.1-8B ") is MODEL_PRESETS["llama3.1-8b"]
    with pytest.raises(ValueError, match=r"llama3\.1-70b"):
        model_preset("gpt-5")


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_flops_grow_with_sequence_and_causal_is_half(name: str) -> None:
    a = model_preset(name)
    assert a.model_flops_per_token(8192) > a.model_flops_per_token(4096)
    if not a.sliding_window and not a.is_hybrid:
        assert a.attention_flops_per_token(4096, True) == pytest.approx(a.attention_flops_per_token(4096, False) / 2)
    # training FLOPs are at least 6 x (non-embedding) active params per token
    assert a.model_flops_per_token(4096) >= 6 * (a.active_params - a.embedding_params)


# --- memory -------------------------------------------------------------------------------------------


PLAN_8 = Plan(tp=8, pp=1, dp=1)
PLAN_PP = Plan(tp=4, pp=4, cp=2, vp=5, dp=4)


@pytest.mark.parametrize(
    "chain",
    [
        ["llama3.1-8b", "llama3.1-70b", "llama3.1-405b"],
        ["nemotron4-15b", "nemotron4-340b"],
        ["llama2-70b", "llama3.1-70b", "qwen2.5-72b"],
        ["llama3.1-70b", "gpt3-175b", "nemotron4-340b"],
    ],
)
@pytest.mark.parametrize("plan", [PLAN_8, PLAN_PP, Plan(tp=2, pp=1, cp=2, dp=32, zero=3)], ids=["tp8", "pp", "z3"])
def test_memory_grows_with_model_size(chain: list[str], plan: Plan) -> None:
    totals = [sum(memory_per_gpu(TrainJob(model_preset(m), seq_len=8192), plan, H100).values()) for m in chain]
    assert all(a < b for a, b in itertools.pairwise(totals)), dict(zip(chain, totals, strict=True))


plans = st.builds(
    Plan,
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4, 8]),
    cp=st.sampled_from([1, 2, 4]),
    vp=st.sampled_from([1, 2, 5]),
    mbs=st.sampled_from([1, 2, 4]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    dp=st.sampled_from([1, 2, 8, 64]),
)
jobs = st.builds(
    TrainJob,
    arch=st.sampled_from(sorted(MODEL_PRESETS)).map(model_preset),
    precision=st.sampled_from(["bf16", "fp8", "fp32"]),
    seq_len=st.sampled_from([2048, 4096, 8192]),
    global_batch=st.sampled_from([64, 256, 1024]),
)


@settings(max_examples=100, deadline=None)
@given(job=jobs, plan=plans)
def test_higher_zero_stage_never_uses_more_memory(job: TrainJob, plan: Plan) -> None:
    totals = []
    for zero in (0, 1, 2, 3):
        mem = memory_per_gpu(job, Plan(**{**plan.__dict__, "zero": zero}), H100)
        assert all(v >= 0 for v in mem.values())
        totals.append(sum(mem.values()))
    assert all(b <= a for a, b in itertools.pairwise(totals)), totals


@settings(max_examples=100, deadline=None)
@given(job=jobs, plan=plans)
def test_recompute_saves_activation_memory(job: TrainJob, plan: Plan) -> None:
    def act(rec: str) -> float:
        return memory_per_gpu(job, Plan(**{**plan.__dict__, "recompute": rec}), H100)["activations"]

    assert act("selective") <= act("none")
    layers_stage = -(-job.arch.layers // plan.pp)
    if layers_stage >= 2:  # with one layer per stage, keeping its input costs a little extra
        assert act("full") < act("none")


def test_405b_on_8_h100_does_not_fit() -> None:
    job = TrainJob(model_preset("llama3.1-405b"), seq_len=8192, global_batch=8)
    est = evaluate(job, Plan(tp=8, pp=1, dp=1), _compact(_cluster(), 8))
    assert not est.fits
    assert est.memory_bytes_per_gpu > H100.memory_GB * 1e9
    assert est.memory_breakdown["weights"] > 80e9 / 2  # 405e9 / 8 params x 2 B alone exceed 40 GB


def test_search_flags_when_nothing_fits() -> None:
    job = TrainJob(model_preset("llama3.1-405b"), seq_len=8192, global_batch=8)
    results = search(job, _compact(_cluster(), 8))
    assert results
    assert not any(r.fits for r in results)
    mems = [r.memory_bytes_per_gpu for r in results]
    assert mems == sorted(mems)


# --- step time ----------------------------------------------------------------------------------------


def test_fixed_plan_estimate_is_consistent(superpod: Cluster) -> None:
    job = TrainJob(model_preset("llama3.1-70b"), seq_len=8192, global_batch=256)
    est = evaluate(job, PLAN_PP, _compact(superpod, 128))
    assert est.fits
    assert 0.0 < est.mfu < 1.0
    assert est.tokens_per_s == pytest.approx(256 * 8192 / est.step_time_s)
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s, rel=1e-9)
    assert est.fits == (est.memory_bytes_per_gpu <= H100.memory_GB * 1e9)
    assert est.memory_bytes_per_gpu == pytest.approx(sum(est.memory_breakdown.values()))
    assert est.as_dict()["plan"]["tp"] == 4  # type: ignore[index]


def test_placement_sensitivity_scattered_nodes(superpod: Cluster) -> None:
    """The scheduler relies on this: the same plan on nodes scattered one per oversubscribed leaf is slower."""
    job = TrainJob(model_preset("llama3.1-70b"), seq_len=8192, global_batch=256)
    compact = evaluate(job, PLAN_PP, _compact(superpod, 128))
    wide = _cluster(
        nodes=512,
        nodes_per_leaf=32,
        leaves_per_spine=4,
        leaf_oversubscription=2.0,
        spine_oversubscription=2.0,
    )
    one_per_leaf = np.concatenate([np.asarray(wide.gpus_of_node(n)) for n in range(0, 512, 32)])
    assert wide.span(one_per_leaf)["leaf"] == 16
    scattered = evaluate(job, PLAN_PP, Placement(wide, one_per_leaf))
    same_cluster_compact = evaluate(job, PLAN_PP, _compact(wide, 128))
    assert compact.step_time_s < scattered.step_time_s
    assert same_cluster_compact.step_time_s < scattered.step_time_s
    assert same_cluster_compact.step_time_s == pytest.approx(compact.step_time_s)


def test_25gbe_is_slower_than_800g_roce() -> None:
    job = TrainJob(model_preset("llama3.1-70b"), seq_len=8192, global_batch=256)
    roce, eth = load_preset("h20-roce800-128"), load_preset("h20-eth25g-128")
    best_roce = search(job, _compact(roce, 128))[0]
    best_eth = search(job, _compact(eth, 128))[0]
    assert best_roce.fits and best_eth.fits
    assert best_eth.step_time_s > best_roce.step_time_s
    # and the plan that is best on RoCE is slower still on 25GbE
    assert evaluate(job, best_roce.plan, _compact(eth, 128)).step_time_s > best_roce.step_time_s


@pytest.mark.parametrize("model", ["llama3.1-8b", "llama3.1-70b"])
def test_more_gpus_never_lower_throughput_best_plan(model: str) -> None:
    big = load_preset("synthetic-100k")
    tokens = []
    for n in (16, 32, 64, 128, 256):
        job = TrainJob(model_preset(model), seq_len=8192, global_batch=2 * n)  # two sequences per GPU
        best = search(job, _compact(big, n))[0]
        assert best.fits
        tokens.append(best.tokens_per_s)
    assert all(b >= a for a, b in itertools.pairwise(tokens)), tokens


def test_more_gpus_never_lower_throughput_fixed_model_parallelism() -> None:
    big = load_preset("synthetic-100k")
    tokens = []
    for dp in (1, 2, 4, 8, 16, 32):
        n = 32 * dp
        job = TrainJob(model_preset("llama3.1-70b"), seq_len=8192, global_batch=16 * dp)
        plan = Plan(tp=4, pp=4, cp=2, vp=5, dp=dp)
        tokens.append(evaluate(job, plan, _compact(big, n)).tokens_per_s)
    assert all(b >= a for a, b in itertools.pairwise(tokens)), tokens


# --- plan validation ------------------------------------------------------------------------------------


BAD_PLANS = [
    (Plan(tp=4, pp=4, cp=2, dp=2), 128, 256, 8192, r"tp\*pp\*cp\*dp"),
    (Plan(tp=8, pp=1, dp=16, mbs=1), 128, 100, 8192, "global batch"),
    (Plan(tp=8, pp=1, dp=16, mbs=4), 128, 32, 8192, "global batch"),
    (Plan(tp=1, pp=64, dp=2, vp=2), 128, 256, 8192, "layers cannot fill"),  # 128 chunks > 80 layers + 2
    (Plan(tp=3, pp=1, dp=32), 96, 256, 8192, "heads"),  # 64 query heads do not split three ways
    (Plan(tp=4, pp=1, cp=4, dp=8), 128, 256, 6148, "sequence"),
    (Plan(tp=8, pp=4, vp=2, dp=4), 128, 24, 8192, "interleaved"),
]


@pytest.mark.parametrize(("plan", "n", "gbs", "seq", "match"), BAD_PLANS)
def test_bad_plan_raises_plan_error(plan: Plan, n: int, gbs: int, seq: int, match: str) -> None:
    job = TrainJob(model_preset("llama3.1-70b"), seq_len=seq, global_batch=gbs)
    with pytest.raises(PlanError, match=match):
        step_time(job, plan, H100, n, lambda stride, size: pytest.fail("a bad plan must fail before costing"))


def test_plan_error_is_a_value_error(superpod: Cluster) -> None:
    job = TrainJob(model_preset("llama3.1-8b"), global_batch=7)
    with pytest.raises(ValueError):
        evaluate(job, Plan(tp=8, dp=2), _compact(superpod, 16))


def test_search_without_any_valid_plan_raises(superpod: Cluster) -> None:
    job = TrainJob(model_preset("llama3.1-8b"), global_batch=7)  # no dp*mbs divides 7 on 48 GPUs with tp<=8
    with pytest.raises(PlanError, match="no parallel plan"):
        search(job, _compact(superpod, 48), fixed={"tp": 1, "pp": 1, "cp": 1})


# --- plan search ----------------------------------------------------------------------------------------

SEARCH_CLUSTERS = {
    "dgx-h100-superpod-su": load_preset("dgx-h100-superpod-su"),
    "h20-roce800-128": load_preset("h20-roce800-128"),
    "gb300-nvl72": load_preset("gb300-nvl72"),
}


@settings(max_examples=20, deadline=None)
@given(
    cluster=st.sampled_from(sorted(SEARCH_CLUSTERS)),
    model=st.sampled_from(["llama3.1-8b", "llama3.1-70b", "nemotron4-15b", "gpt3-175b"]),
    gpus=st.sampled_from([8, 16, 32, 64, 128]),
    seq=st.sampled_from([4096, 8192]),
    per_gpu_batch=st.sampled_from([1, 2, 4]),
)
def test_search_returns_valid_fitting_plans(cluster: str, model: str, gpus: int, seq: int, per_gpu_batch: int) -> None:
    c = SEARCH_CLUSTERS[cluster]
    gpus = min(gpus, c.n_gpus // 8 * 8)
    job = TrainJob(model_preset(model), seq_len=seq, global_batch=per_gpu_batch * gpus)
    placement = _compact(c, gpus)
    results = search(job, placement, top=5)
    assert 1 <= len(results) <= 5
    group = placement.group_fn()
    any_fits = False
    for plan in candidate_plans(job, gpus, placement.domain_size):
        try:
            if step_time(job, plan, c.groups[0].gpu, gpus, group).fits:
                any_fits = True
                break
        except PlanError:
            continue
    if any_fits:
        assert all(r.fits for r in results), [r.plan.label() for r in results if not r.fits]
        times = [r.step_time_s for r in results]
        assert times == sorted(times)
    for r in results:
        p = r.plan
        assert p.tp * p.pp * p.cp * p.dp == gpus
        assert p.tp <= min(8, placement.domain_size)
        assert job.global_batch % (p.dp * p.mbs) == 0
        assert job.arch.heads % p.tp == 0
        if p.pp > 1:
            assert job.arch.layers % (p.pp * p.vp) == 0
        assert r.step_time_s > 0 and 0 < r.mfu < 1


def test_search_respects_fixed_sizes(superpod: Cluster) -> None:
    job = TrainJob(model_preset("llama3.1-70b"), seq_len=8192, global_batch=256)
    results = search(job, _compact(superpod, 128), fixed={"tp": 4, "pp": 4, "cp": None})
    assert results
    assert all(r.plan.tp == 4 and r.plan.pp == 4 for r in results)
    best_free = search(job, _compact(superpod, 128))[0]
    assert best_free.step_time_s <= results[0].step_time_s


H20_ROCE, H20_ETH = load_preset("h20-roce800-128"), load_preset("h20-eth25g-128")
JOB_70B = TrainJob(model_preset("llama3.1-70b"), seq_len=8192, global_batch=256)
PLANS_128 = list(candidate_plans(JOB_70B, 128, 8))


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, len(PLANS_128) - 1))
def test_slower_fabric_never_speeds_up_a_plan(index: int) -> None:
    plan = PLANS_128[index]
    try:
        fast = evaluate(JOB_70B, plan, _compact(H20_ROCE, 128))
    except PlanError:
        return
    slow = evaluate(JOB_70B, plan, _compact(H20_ETH, 128))
    assert slow.step_time_s >= fast.step_time_s * (1 - 1e-12), plan.label()
    assert slow.memory_bytes_per_gpu == fast.memory_bytes_per_gpu


def test_degenerate_plans_are_plan_errors() -> None:
    from suanli.perf import Placement, Plan, PlanError, TrainJob, evaluate, model_preset
    from suanli.topology import load_preset

    c = load_preset("1x8:H100")
    pl = Placement(c, c.compact_gpus(8))
    with pytest.raises(PlanError):
        evaluate(TrainJob(model_preset("llama3.1-8b"), "bf16", 4096, 64), Plan(dp=8, mbs=0), pl)
    with pytest.raises(PlanError):
        evaluate(TrainJob(model_preset("llama3.1-8b"), "bf16", 4096, 0), Plan(dp=8), pl)
