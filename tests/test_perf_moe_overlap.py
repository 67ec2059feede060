"""EP all-to-all overlap (Megatron `overlap_moe_expert_parallel_comm`): what it may and may not do to a step."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suanli.perf import Placement, Plan, PlanError, TrainJob, evaluate, model_preset
from suanli.perf.layers import EP_COMM_SMS, ep_overlapped
from suanli.perf.training import unpaired_fraction
from suanli.topology import parse


def _placement(nodes: int, gpus: int) -> Placement:
    c = parse({"name": "t", "fabric": "ib-ndr",
               "node_groups": [{"name": "n", "count": nodes, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8}]})  # fmt: skip
    return Placement(c, c.compact_gpus(gpus))


JOB = TrainJob(model_preset("qwen3-30b-a3b"), "bf16", 4096, 64)
ACROSS = Plan(ep=16, dp=16, mbs=1)  # EP across two HGX nodes: the all-to-all is a large part of the step


@given(st.floats(0, 10), st.floats(0, 10), st.floats(0, 10), st.sampled_from([108, 132, 148, 160]))
def test_overlap_never_beats_compute_nor_loses_to_serial(comm: float, mixer: float, ffn: float, sms: int) -> None:
    exposed = ep_overlapped(comm, mixer, ffn, sms)
    assert 0.0 <= exposed <= comm + 1e-12  # never worse than running the all-to-alls after the compute
    assert exposed >= comm - (mixer + ffn) - 1e-12  # what no compute covers stays exposed


def test_overlap_exposes_nothing_without_comm_and_the_sm_share_with_ample_compute() -> None:
    assert ep_overlapped(0.0, 1.0, 1.0, 132) == 0.0
    # comm far below every chunk: only the SMs the comm kernels hold cost time
    assert ep_overlapped(0.04, 10.0, 10.0, 132) == pytest.approx(0.04 * EP_COMM_SMS / 132)


def test_overlap_exposure_grows_with_comm() -> None:
    vals = [ep_overlapped(c, 0.3, 0.6, 132) for c in (0.0, 0.2, 0.5, 1.0, 2.0, 4.0)]
    assert vals == sorted(vals) and vals[-1] > vals[0]


@pytest.mark.parametrize(("pp", "vp"), [(1, 1), (4, 1), (4, 2), (8, 4)])
def test_unpaired_share_falls_with_micro_batches(pp: int, vp: int) -> None:
    shares = [unpaired_fraction(pp, vp, m) for m in (pp, 2 * pp, 8 * pp, 64 * pp)]
    assert all(0.0 < s <= 1.0 for s in shares)
    assert shares == sorted(shares, reverse=True) and shares[-1] < shares[0]
    assert unpaired_fraction(1, 1, 1) == 1.0  # one micro-batch: nothing to pair with


def test_overlap_shortens_the_step_but_not_below_its_compute() -> None:
    placement = _placement(2, 16)
    serial = evaluate(JOB, ACROSS, placement)
    overlapped = evaluate(JOB, replace(ACROSS, moe_a2a_overlap=True), placement)
    ep = serial.breakdown["ep_exposed"]
    assert ep > 0.1 * serial.step_time_s
    assert overlapped.step_time_s < serial.step_time_s
    assert overlapped.step_time_s >= serial.step_time_s - ep - 1e-9
    assert overlapped.breakdown["ep_exposed"] < ep
    assert "A2A-overlap" in overlapped.plan.label()


def test_overlap_changes_nothing_without_expert_parallelism() -> None:
    placement = _placement(1, 8)
    plan = Plan(dp=8)
    assert evaluate(JOB, replace(plan, moe_a2a_overlap=True), placement).step_time_s == pytest.approx(
        evaluate(JOB, plan, placement).step_time_s
    )
    dense = TrainJob(model_preset("llama3.1-8b"), "bf16", 4096, 64)
    assert evaluate(dense, replace(plan, moe_a2a_overlap=True), placement).step_time_s == pytest.approx(
        evaluate(dense, plan, placement).step_time_s
    )


def test_overlap_with_full_recompute_is_refused() -> None:
    with pytest.raises(PlanError, match="full recompute"):
        evaluate(JOB, replace(ACROSS, moe_a2a_overlap=True, recompute="full"), _placement(2, 16))


def test_plain_alltoall_dispatch_costs_more_across_nodes_and_the_same_inside_one() -> None:
    across = _placement(2, 16)
    flex = evaluate(JOB, ACROSS, across)
    plain = evaluate(JOB, replace(ACROSS, moe_dispatcher="alltoall"), across)
    # top-8 of 128 experts over two nodes: a plain all-to-all sends 8 * 1/2 = 4 copies of a token across,
    # the flex dispatcher at most one per other node
    assert plain.breakdown["ep_exposed"] > 2 * flex.breakdown["ep_exposed"]
    assert "alltoall-dispatch" in plain.plan.label()
    inside, plan = _placement(1, 8), Plan(ep=8, dp=8)
    assert evaluate(JOB, replace(plan, moe_dispatcher="alltoall"), inside).step_time_s == pytest.approx(
        evaluate(JOB, plan, inside).step_time_s
    )


def test_unknown_dispatcher_is_refused() -> None:
    with pytest.raises(PlanError, match="dispatcher"):
        evaluate(JOB, replace(ACROSS, moe_dispatcher="ring"), _placement(2, 16))  # type: ignore[arg-type]


def test_overlap_matches_a_published_on_off_measurement() -> None:
    """Megatron-Bridge's EP-overlap skill page (NVIDIA-NeMo/Megatron-Bridge, skills/nemo-mbridge-perf-expert-
    parallel-overlap/SKILL.md, 2026-07-25 run): Qwen3-30B-A3B pre-training on 16 H100, BF16, seq 4096, EP16, MBS1,
    GBS1024, HybridEP, balanced routing: 24.71 s per step without the overlap, 20.99 s with it. Not one of the
    accuracy benchmark's rows; nothing in the model was set from it."""
    job = TrainJob(model_preset("qwen3-30b-a3b"), "bf16", 4096, 1024)
    plan, placement = Plan(ep=16, dp=16), _placement(2, 16)
    off = evaluate(job, plan, placement).step_time_s
    on = evaluate(job, replace(plan, moe_a2a_overlap=True), placement).step_time_s
    assert off == pytest.approx(24.71, rel=0.10)
    assert on == pytest.approx(20.99, rel=0.10)
    assert on / off == pytest.approx(20.99 / 24.71, abs=0.05)


def test_fp8_attention_speeds_only_attention_and_needs_an_fp8_recipe() -> None:
    job, placement = replace(JOB, precision="fp8"), _placement(1, 8)
    plan = Plan(ep=8, dp=8)
    base = evaluate(job, plan, placement)
    fp8 = evaluate(job, replace(plan, fp8_attention=True), placement)
    assert fp8.breakdown["compute_attention"] < base.breakdown["compute_attention"]
    assert fp8.breakdown["compute_linear"] == pytest.approx(base.breakdown["compute_linear"])
    assert fp8.step_time_s >= base.step_time_s - base.breakdown["compute_attention"]
    assert "FP8-attention" in fp8.plan.label()
    with pytest.raises(PlanError, match="fp8 attention"):
        evaluate(JOB, replace(plan, fp8_attention=True), placement)


@pytest.mark.parametrize("module", ["mla_up_proj", "layernorm", "moe_act", "mlp"])
def test_each_recompute_module_costs_time_and_never_saves_any(module: str) -> None:
    job = TrainJob(model_preset("deepseek-v3"), "mxfp8", 4096, 512)
    c = parse({"name": "t", "node_groups": [{"name": "n", "count": 8, "gpu": "B200", "gpus_per_node": 8, "nics": 8}],
               "fabric": "ib-ndr"})  # fmt: skip
    placement = Placement(c, c.compact_gpus(64))
    plan = Plan(dp=64, ep=8, recompute="selective")  # one stage: every layer kind on the critical path
    base = evaluate(job, plan, placement)
    more = evaluate(job, replace(plan, recompute_modules=(module,)), placement)
    assert more.step_time_s > base.step_time_s
    assert more.breakdown["recompute"] > base.breakdown["recompute"] == 0.0
    # never more than recomputing whole layers
    assert more.step_time_s < evaluate(job, replace(plan, recompute="full"), placement).step_time_s


def test_mla_up_projection_recompute_is_free_without_mla() -> None:
    placement, plan = _placement(1, 8), Plan(ep=8, dp=8, recompute="selective")
    assert evaluate(JOB, replace(plan, recompute_modules=("mla_up_proj",)), placement).step_time_s == pytest.approx(
        evaluate(JOB, plan, placement).step_time_s
    )


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        (Plan(ep=8, dp=8, recompute_modules=("moe_act",)), "selective"),
        (Plan(ep=8, dp=8, recompute="selective", recompute_modules=("everything",)), "unknown recompute"),
    ],
)
def test_bad_recompute_modules_are_refused(plan: Plan, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        evaluate(JOB, plan, _placement(1, 8))
