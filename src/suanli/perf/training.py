"""Step time, memory and parallel-plan search for dense transformer training (Megatron-style 4D/5D).

One model for every system, built from hardware facts and the workload's arithmetic:

* compute — linear layers at the GPU's measured achievable matmul rate (MAMF), causal flash attention at a
  fixed fraction of that rate, element-wise kernels at achievable HBM bandwidth, a per-kernel launch cost;
* communication — every TP/CP/PP/DP collective costed by `collectives.estimate` on the GPUs that would
  really form that group (so a scattered or 25GbE placement is slower), and only its exposed part counted:
  TP overlaps with the adjacent GEMM (except its first chunk), CP with attention, DP with the last
  micro-batch's backward and the first one's forward;
* the pipeline bubble `(pp-1)/vp` micro-batch slots.

MFU uses the Megatron/NeMo FLOP formula (see `TransformerArch.model_flops_per_token`).
"""

from __future__ import annotations

from dataclasses import dataclass

from suanli.catalog import GPUSpec
from suanli.perf import collectives, layers
from suanli.perf.models import TransformerArch
from suanli.perf.pipeline import OPTION_TEXT, PipelineSplit, split_layers
from suanli.perf.train_plan import (
    DEFAULT_MOE_IMBALANCE,
    LOW_PRECISION,
    RECOMPUTE_MODULES,
    TENSOR_PRECISION,
    TRAIN_PRECISIONS,
    GroupFn,
    Plan,
    PlanError,
    Recompute,
    TrainEstimate,
    TrainJob,
    TrainPrecision,
    overlap_gap,
    precision_gap,
    tensor_precision,
    unpaired_fraction,
    validate,
)

__all__ = [  # the plan types live in train_plan; importing them from here keeps working
    "DEFAULT_MOE_IMBALANCE", "LOW_PRECISION", "RECOMPUTE_MODULES", "TENSOR_PRECISION", "TRAIN_PRECISIONS", "GroupFn",
    "Plan", "PlanError", "Recompute", "TrainEstimate", "TrainJob", "TrainPrecision", "memory_per_gpu", "overlap_gap",
    "precision_gap", "step_time", "tensor_precision", "unpaired_fraction",
]  # fmt: skip

# ---- physical constants of the model (global: none is fitted to a reference case) ---------------
DEFAULT_MATMUL_EFFICIENCY = 0.70  # GPUs without a published MAMF measurement
# flash attention fwd+bwd vs GEMM throughput: FA2 measured 328 TFLOPS on H100 (0.41 of its MAMF), 180 on
# A100 (0.66); FA3/cuDNN kernels do better on Hopper. One midpoint for every GPU.
ATTENTION_VS_MATMUL = 0.50
# Training holds the GPU at its power limit for hours: sustained clocks sit below the boost clock at
# which peaks (and short MAMF sweeps) are measured.
SUSTAINED_CLOCK_FACTOR = 0.90
HBM_EFFICIENCY = 0.89  # STREAM triad / peak HBM bandwidth (H100: 2.97 of 3.35 TB/s)
RUNTIME_RESERVE_BYTES = 3.0e9  # CUDA context, NCCL buffers, cuBLAS workspace, allocator fragmentation
# FP8 flash attention (Transformer Engine `fp8_dot_product_attention`) vs BF16: FlashAttention-3 (Shah et al.
# 2024) reaches close to 1.2 PFLOPS in FP8 and 740 TFLOPS in BF16 on H100 (abstract); the ratio, for every GPU
FP8_ATTENTION_SPEEDUP = 1.2 / 0.74
GRAD_BUCKETS_EXPOSED = 1.0  # DP reduction overlaps all but the final micro-batch's backward
TILE_M, TILE_N = layers.TILE_M, layers.TILE_N
gemm_efficiency = layers.gemm_efficiency


def _act_bytes_per_token(a: TransformerArch, kind: tuple[str, str], recompute: Recompute, imbalance: float) -> float:
    """Activation bytes one layer keeps for backward per token, 16-bit (Korthikanti et al. 2022 style, flash
    attention: no s x s scores, so `selective` saves nothing further). Full recompute keeps the layer input."""
    h = a.hidden
    if recompute == "full":
        return 2.0 * h
    mixer, ffn = kind
    out = 0.0
    if mixer == "attn":
        qkv = a.heads * a.qk_head_dim + a.kv_heads * (a.qk_head_dim + a.v_dim)
        out += 2 * (4 * h + qkv) + 2 * h  # norm in, qkv in, q/k/v, attention out, o-proj out; dropout masks
    elif mixer == "mamba":
        di = a.mamba_expand * h
        out += 2 * (4 * h + 2 * di + 2 * a.mamba_groups * a.mamba_state) + 2 * h
    mult = 3 if a.gated_mlp else 2
    if ffn == "dense":
        out += 2 * (h + h) + 2 * mult * a.ffn
    elif ffn == "moe":
        shared = a.shared_experts * (a.shared_ffn or a.moe_ffn)
        out += 2 * (h + h) + a.top_k * imbalance * (2 * h + 2 * mult * a.moe_ffn) + 2 * mult * shared
    return out


@dataclass(frozen=True)
class _StageParams:
    dense: float  # parameters replicated over the data-parallel group (split by TP)
    expert: float  # routed-expert parameters (split by EP x ETP)


def _stage_params(a: TransformerArch, ranges: list[tuple[int, int]], first: bool, last: bool) -> _StageParams:
    pre = a.layer_param_prefix
    dense = float(sum(pre[hi][0] - pre[lo][0] for lo, hi in ranges))
    expert = float(sum(pre[hi][1] - pre[lo][1] for lo, hi in ranges))
    if first:
        dense += a.vocab * a.hidden
    if last:
        dense += a.vocab * a.hidden * (0 if a.tied_embeddings else 1) + a.hidden
        if a.mtp_layers:
            routed = a.mtp_layers * a.experts * a.expert_params if a.is_moe else 0
            dense += a.mtp_params - routed
            expert += routed
    return _StageParams(dense, expert)


def _split(job: TrainJob, plan: Plan) -> PipelineSplit:
    try:
        return split_layers(job.arch.layers, plan.pp, plan.vp)
    except ValueError as e:
        raise PlanError(str(e)) from e


def _kind_counts(kinds: tuple[tuple[str, str], ...], ranges: list[tuple[int, int]]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for lo, hi in ranges:
        for k in kinds[lo:hi]:
            counts[k] = counts.get(k, 0) + 1
    return counts


def _split_for_memory(job: TrainJob, plan: Plan) -> PipelineSplit:
    """The split memory is counted on; a plan Megatron cannot lay out still gets its layers spread evenly
    (memory answers for any plan; step_time refuses the impossible ones)."""
    try:
        return split_layers(job.arch.layers, plan.pp, plan.vp)
    except ValueError:
        per = -(-job.arch.layers // plan.pp)
        sizes = [max(0, min(per, job.arch.layers - per * s)) for s in range(plan.pp)]
        return PipelineSplit(tuple(sizes), "layout")


def _expert_dp(plan: Plan) -> int:
    return max(1, plan.tp * plan.cp * plan.dp // (plan.ep * plan.etp))


def memory_per_gpu(job: TrainJob, plan: Plan, gpu: GPUSpec) -> dict[str, float]:
    """Bytes per GPU on the busiest pipeline stage (the first: most in-flight micro-batches; or the last:
    logits and MTP)."""
    a, p = job.arch, plan
    split = _split_for_memory(job, p)
    ranges = split.layer_ranges(p.pp)
    nd, edp = p.dp * p.cp, _expert_dp(p)  # distributed optimizer shards dense state over DP x CP
    weight_b = 4.0 if job.precision == "fp32" else 2.0 + (1.0 if job.precision in LOW_PRECISION else 0.0)
    grad_b = 4.0 if job.precision == "fp32" else 2.0
    opt_b = 12.0  # fp32 master weights + Adam m and v
    tokens_mb = p.mbs * job.seq_len / p.cp
    m = max(1, job.global_batch // (p.dp * p.mbs))
    kinds = a.layer_kinds()
    best: dict[str, float] = {}
    for s in sorted({0, p.pp - 1}):
        sp = _stage_params(a, ranges[s], s == 0, s == p.pp - 1)
        dense, expert = sp.dense / p.tp, sp.expert / (p.ep * p.etp)

        def shard(x: float, y: float, stage: int) -> float:
            return x / (nd if p.zero >= stage else 1) + y / (edp if p.zero >= stage else 1)

        weights = shard(dense * weight_b, expert * weight_b, 3)
        grads = shard(dense * grad_b, expert * grad_b, 2)
        optim = shard(dense * opt_b, expert * opt_b, 1)
        in_flight = float(min(p.pp - s, m))
        if s == 0 and p.vp > 1 and p.pp > 1:
            in_flight *= 1 + (p.pp - 1) / (p.pp * p.vp)
        per_kind = {k: _act_bytes_per_token(a, k, p.recompute, job.moe_imbalance) for k in set(kinds)}
        per_token = sum(per_kind[k] * n for k, n in _kind_counts(kinds, ranges[s]).items())
        act = per_token * tokens_mb / p.tp * in_flight
        if p.recompute == "full" and ranges[s]:
            lo = ranges[s][0][0]
            act += _act_bytes_per_token(a, kinds[min(lo, a.layers - 1)], "none", job.moe_imbalance) * tokens_mb / p.tp
        logits = 4.0 * tokens_mb * a.vocab / p.tp * (1 + a.mtp_layers) if s == p.pp - 1 else 0.0
        mem = {"weights": weights, "gradients": grads, "optimizer": optim, "activations": act, "logits": logits,
               "runtime": RUNTIME_RESERVE_BYTES}  # fmt: skip
        if sum(mem.values()) > sum(best.values()):
            best = mem
    return best


def _matmul_rate(gpu: GPUSpec, precision: TrainPrecision) -> float:
    """Achievable dense matmul FLOP/s."""
    gap = precision_gap(gpu, precision)
    if gap:
        raise ValueError(gap)
    prec = tensor_precision(precision)
    eff = gpu.matmul_efficiency.get(prec, DEFAULT_MATMUL_EFFICIENCY)
    return gpu.peak_tflops(prec) * 1e12 * eff * SUSTAINED_CLOCK_FACTOR


def step_time(
    job: TrainJob, plan: Plan, gpu: GPUSpec, n_gpus: int, group: GroupFn, memo: dict[object, object] | None = None
) -> TrainEstimate:
    """Predict one optimizer step of `job` under `plan` on `n_gpus` GPUs laid out as `group` describes.

    `memo`: a dict the caller keeps across plans of one job on one placement (the plan search), so layer
    costs that do not depend on pp, vp, dp or ZeRO are computed once."""
    a, p = job.arch, plan
    validate(job, p, n_gpus)
    split = _split(job, p)
    m = job.global_batch // (p.dp * p.mbs)  # micro-batches per pipeline per step
    mm_rate = _matmul_rate(gpu, job.precision)
    attn_rate = _matmul_rate(gpu, "bf16" if job.precision in (*LOW_PRECISION, "bf16") else job.precision)
    if p.fp8_attention:
        attn_rate *= FP8_ATTENTION_SPEEDUP
    hbm = gpu.mem_bw_GBps * 1e9 * HBM_EFFICIENCY
    act_b = 4 if job.precision == "fp32" else 2
    tokens = p.mbs * job.seq_len / p.cp  # tokens each CP rank processes per micro-batch
    env = layers.LayerEnv(
        arch=a, seq_len=job.seq_len, tokens=tokens, tp=p.tp, cp=p.cp, ep=p.ep, etp=p.etp, mm_rate=mm_rate,
        attn_rate=attn_rate * ATTENTION_VS_MATMUL, hbm=hbm, sms=gpu.sms, act_b=act_b,
        low_precision=job.precision in LOW_PRECISION, full_recompute=p.recompute == "full",
        imbalance=job.moe_imbalance, group=group, flex_dispatch=p.moe_dispatcher == "flex",
        recompute_modules=frozenset(p.recompute_modules),
    )  # fmt: skip
    kinds = a.layer_kinds()
    memo = memo if memo is not None else {}
    per_kind: dict[object, layers.LayerTime] = {}
    for k in set(kinds):
        key = (k, p.tp, p.cp, p.ep, p.etp, p.mbs, p.recompute, p.moe_dispatcher, p.fp8_attention, p.recompute_modules)
        if key not in memo:
            memo[key] = layers.layer_time(env, k)
        per_kind[k] = memo[key]  # type: ignore[assignment]
    ranges = split.layer_ranges(p.pp)
    stages: list[layers.LayerTime] = []
    for rs in ranges:
        counts = _kind_counts(kinds, rs)
        st = layers.LayerTime()
        for k, n in counts.items():
            st.add(per_kind[k].scaled(n))  # type: ignore[index]
        if p.moe_a2a_overlap and st.ep:
            u = unpaired_fraction(p.pp, p.vp, m)
            st.ep = u * st.ep + (1 - u) * st.ep_paired
        stages.append(st)
    logits = [
        (tokens, a.vocab / p.tp, a.hidden),
        (tokens, a.hidden, a.vocab / p.tp),
        (a.hidden, a.vocab / p.tp, tokens),
    ]
    t_logits = layers.gemm_time(logits, mm_rate, gpu.sms) + 3 * tokens * a.vocab * 4 / p.tp / hbm
    t_extra_last = t_logits
    if a.mtp_layers:  # each MTP module: projection, one block, its own logits
        mtp_kind = ("attn", "moe" if a.is_moe else "dense")
        key = (
            mtp_kind,
            p.tp,
            p.cp,
            p.ep,
            p.etp,
            p.mbs,
            p.recompute,
            p.moe_dispatcher,
            p.fp8_attention,
            p.recompute_modules,
        )
        if key not in memo:
            memo[key] = layers.layer_time(env, mtp_kind)  # type: ignore[arg-type]
        lt: layers.LayerTime = memo[key]  # type: ignore[assignment]
        block = lt.total
        if p.moe_a2a_overlap and lt.ep:
            u = unpaired_fraction(p.pp, p.vp, m)
            block += (u - 1) * (lt.ep - lt.ep_paired)
        proj = layers.gemm_time(layers.fwd_bwd([(tokens, a.hidden, 2 * a.hidden / p.tp)]), mm_rate, gpu.sms)
        t_extra_last += a.mtp_layers * (block + proj + t_logits)
    totals = [st.total for st in stages]
    t_mb = sum(totals) / p.pp + (t_extra_last if p.pp == 1 else 0.0)  # a typical stage
    slowest = max(range(p.pp), key=lambda s: totals[s] + (t_extra_last if s == p.pp - 1 else 0.0))
    t_mb_slowest = totals[slowest] + (t_extra_last if slowest == p.pp - 1 else 0.0)

    t_pp = 0.0
    if p.pp > 1:
        pp_group = group(p.tp * p.cp * p.dp, 2)
        act_bytes = int(tokens * a.hidden * act_b / p.tp)
        hop = collectives.estimate("send_recv", act_bytes, pp_group).time_us * 1e-6
        t_pp = 2 * (p.pp * p.vp - 1) * hop  # activations and gradients along the critical path
    bubble = (p.pp - 1) / p.vp * t_mb if p.pp > 1 else 0.0
    t_pipeline = m * t_mb_slowest + bubble + t_pp

    # -- data parallel: dense gradients over DP x CP, expert gradients over the expert-data-parallel group --
    nd, edp = p.dp * p.cp, _expert_dp(p)
    sps = [_stage_params(a, ranges[s], s == 0, s == p.pp - 1) for s in range(p.pp)]
    big = max(sps, key=lambda x: x.dense / p.tp + x.expert / (p.ep * p.etp))
    dense_gpu, expert_gpu = big.dense / p.tp, big.expert / (p.ep * p.etp)
    t_dp = 0.0
    parts = [(dense_gpu, nd, group(p.tp, nd) if nd > 1 else None)]
    if expert_gpu and edp > 1:
        parts.append((expert_gpu, edp, group(p.ep * p.etp, edp)))
    t_rs = t_ag = 0.0
    per_mb = 0.0
    for params_gpu, size, g in parts:
        if g is None or size <= 1:
            continue
        grad_bytes, param_bytes = int(params_gpu * 4), int(params_gpu * act_b)  # fp32 main grads
        if p.zero >= 3:
            ag = collectives.estimate("all_gather", param_bytes, g).time_us * 1e-6
            rs = collectives.estimate("reduce_scatter", param_bytes, g).time_us * 1e-6
            per_mb += 2 * ag + rs  # gather for forward and backward, reduce gradients, every micro-batch
        else:
            op = "reduce_scatter" if p.zero >= 1 else "all_reduce"
            t_rs += collectives.estimate(op, grad_bytes, g).time_us * 1e-6
            if p.zero >= 1:
                t_ag += collectives.estimate("all_gather", param_bytes, g).time_us * 1e-6
    if p.zero >= 3:
        t_dp = m * max(0.0, per_mb - t_mb)
    else:
        t_dp = max(0.0, t_rs - GRAD_BUCKETS_EXPOSED * 2 / 3 * t_mb) + max(0.0, t_ag - t_mb / 3)
    shard = dense_gpu / (nd if p.zero >= 1 else 1) + expert_gpu / (edp if p.zero >= 1 else 1)
    t_opt = shard * 32 / hbm  # read+write master, m, v, grad; write bf16 weight

    step = t_pipeline + t_dp + t_opt
    total_tokens = job.global_batch * job.seq_len
    model_flops = a.model_flops_per_token(job.seq_len) * total_tokens
    peak = gpu.peak_tflops(tensor_precision(job.precision)) * 1e12
    achieved = model_flops / step / n_gpus
    mem = memory_per_gpu(job, p, gpu)
    mem_total = sum(mem.values())
    sl = stages[slowest]
    extra = t_extra_last if slowest == p.pp - 1 else 0.0
    breakdown = {
        "compute_linear": m * (sl.linear + extra),
        "compute_attention": m * sl.attention,
        "elementwise": m * (sl.elementwise + sl.launch),
        "recompute": m * sl.recompute,
        "tp_exposed": m * sl.tp,
        "cp_exposed": m * sl.cp,
        "ep_exposed": m * sl.ep,
        "pp_bubble": bubble,
        "pp_p2p": t_pp,
        "dp_exposed": t_dp,
        "optimizer": t_opt,
    }
    notes: dict[str, object] = {}
    if p.pp > 1:
        notes["pipeline_split"] = {
            "layers_per_stage": split.stage_layers(p.pp),
            "megatron_option": OPTION_TEXT[split.option] or "none",
        }
    if a.is_moe:
        notes["moe_imbalance"] = job.moe_imbalance
        notes["expert_data_parallel"] = edp
    return TrainEstimate(
        plan=p,
        fits=mem_total <= gpu.memory_GB * 1e9,
        memory_bytes_per_gpu=mem_total,
        step_time_s=step,
        tokens_per_s=total_tokens / step,
        mfu=achieved / peak,
        tflops_per_gpu=achieved / 1e12,
        breakdown=breakdown,
        memory_breakdown=mem,
        notes=notes,
    )
