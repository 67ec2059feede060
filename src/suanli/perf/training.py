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

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

from suanli.catalog import GPUSpec, Precision
from suanli.perf import collectives
from suanli.perf.models import TransformerArch
from suanli.topology.model import CommGroup

Recompute = Literal["none", "selective", "full"]
TrainPrecision = Literal["bf16", "fp16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4", "fp32"]
TRAIN_PRECISIONS: tuple[TrainPrecision, ...] = ("bf16", "fp16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4", "fp32")
# the tensor-core rate each training recipe's GEMMs run at: FP8 per-tensor (delayed/current scaling) and
# blockwise (DeepSeek-V3 style 1x128/128x128) and MXFP8 (32-element blocks, Blackwell) all run FP8 GEMMs;
# NVFP4 (16-element blocks) runs FP4 GEMMs on Blackwell
TENSOR_PRECISION: dict[str, Precision] = {"fp32": "tf32", "fp8-blockwise": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}
LOW_PRECISION = ("fp8", "fp8-blockwise", "mxfp8", "nvfp4")


def tensor_precision(precision: TrainPrecision) -> Precision:
    return TENSOR_PRECISION.get(precision, precision)  # type: ignore[return-value]


# ---- physical constants of the model (global: none is fitted to a reference case) ---------------
DEFAULT_MATMUL_EFFICIENCY = 0.70  # GPUs without a published MAMF measurement
# flash attention fwd+bwd vs GEMM throughput: FA2 measured 328 TFLOPS on H100 (0.41 of its MAMF), 180 on
# A100 (0.66); FA3/cuDNN kernels do better on Hopper. One midpoint for every GPU.
ATTENTION_VS_MATMUL = 0.50
# Training holds the GPU at its power limit for hours: sustained clocks sit below the boost clock at
# which peaks (and short MAMF sweeps) are measured.
SUSTAINED_CLOCK_FACTOR = 0.90
HBM_EFFICIENCY = 0.89  # STREAM triad / peak HBM bandwidth (H100: 2.97 of 3.35 TB/s)
KERNEL_OVERHEAD_US = 5.0  # launch gap + tail effect per kernel
KERNELS_PER_LAYER = 100  # forward + backward kernels of one transformer layer (norms, GEMMs, attention, casts)
RUNTIME_RESERVE_BYTES = 3.0e9  # CUDA context, NCCL buffers, cuBLAS workspace, allocator fragmentation
GRAD_BUCKETS_EXPOSED = 1.0  # DP reduction overlaps all but the final micro-batch's backward
# Tensor-core GEMMs run as waves of output tiles, one tile per SM: a GEMM whose tile count is not a
# multiple of the SM count leaves SMs idle in its last wave (wave quantisation). 128x256 is the tile
# cuBLAS/CUTLASS pick for large bf16/fp8 GEMMs on Ampere and Hopper.
TILE_M, TILE_N = 128, 256


def gemm_efficiency(m: float, n: float, sms: int) -> float:
    """Useful fraction of the SM-time a GEMM with an m x n output occupies (partial tiles, last wave)."""
    tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    waves = math.ceil(tiles / sms)
    return (m * n) / (waves * sms * TILE_M * TILE_N)


def _gemm_time(shapes: list[tuple[float, float, float]], rate: float, sms: int) -> float:
    """Seconds for GEMMs given as (m, n, k) at an achievable `rate` FLOP/s before wave quantisation."""
    return sum(2 * m * n * k / (rate * gemm_efficiency(m, n, sms)) for m, n, k in shapes)


def _layer_gemms(a: TransformerArch, tokens: float, tp: int) -> list[tuple[float, float, float]]:
    """(m, n, k) of one layer's forward, input-gradient and weight-gradient GEMMs on one TP rank."""
    h, kv = a.hidden, a.kv_heads * a.head_dim
    up = (2 if a.gated_mlp else 1) * a.ffn
    fwd = [(tokens, (h + 2 * kv) / tp, h), (tokens, h, h / tp), (tokens, up / tp, h), (tokens, h, a.ffn / tp)]
    dgrad = [(m, k, n) for m, n, k in fwd]
    wgrad = [(k, n, m) for m, n, k in fwd]
    return fwd + dgrad + wgrad


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vp: int = 1
    mbs: int = 1
    zero: int = 1
    recompute: Recompute = "none"
    dp: int = 1

    def label(self) -> str:
        return (
            f"TP{self.tp} PP{self.pp} CP{self.cp} DP{self.dp} VP{self.vp} MBS{self.mbs} "
            f"ZeRO-{self.zero} recompute={self.recompute}"
        )


@dataclass(frozen=True)
class TrainJob:
    arch: TransformerArch
    precision: TrainPrecision = "bf16"
    seq_len: int = 4096
    global_batch: int = 256  # sequences per optimizer step


@dataclass(frozen=True)
class TrainEstimate:
    plan: Plan
    fits: bool
    memory_bytes_per_gpu: float
    step_time_s: float
    tokens_per_s: float
    mfu: float
    tflops_per_gpu: float
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_breakdown: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        plan = {k: v for k, v in asdict(self.plan).items()}
        return {
            "step_time_s": round(self.step_time_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "mfu": round(self.mfu, 4),
            "tflops_per_gpu": round(self.tflops_per_gpu, 1),
            "memory_gib_per_gpu": round(self.memory_bytes_per_gpu / 2**30, 2),
            "fits": self.fits,
            "plan": plan,
            "breakdown": {k: round(v, 4) for k, v in self.breakdown.items()},
            "memory_gib": {k: round(v / 2**30, 2) for k, v in self.memory_breakdown.items()},
        }


GroupFn = Callable[[int, int], CommGroup]
"""group(stride, size) → the CommGroup of `size` ranks spaced `stride` apart in placement order."""


class PlanError(ValueError):
    """A parallel plan that cannot be laid out on the GPUs (with the reason)."""


def _act_bytes_per_token_layer(arch: TransformerArch, recompute: Recompute) -> float:
    """Activation bytes kept for backward per token per layer in 16-bit (Korthikanti et al. 2022 style).

    Flash attention keeps no s×s scores, so `selective` saves nothing further on top of it.
    """
    h, kv = arch.hidden, arch.kv_heads * arch.head_dim
    if recompute == "full":
        return 2.0 * h
    attn = 2 * (h + h + (h + 2 * kv) + h + h)  # norm in, qkv in, q/k/v, attention out, o-proj out
    mlp = 2 * (h + h) + (2 * 3 * arch.ffn if arch.gated_mlp else 2 * 2 * arch.ffn)
    masks = 2 * h  # residual/dropout bookkeeping
    return float(attn + mlp + masks)


def memory_per_gpu(job: TrainJob, plan: Plan, gpu: GPUSpec) -> dict[str, float]:
    """Bytes per GPU on the busiest pipeline stage (the first: embedding + most in-flight micro-batches)."""
    a = job.arch
    layers_stage = math.ceil(a.layers / plan.pp)
    params = (layers_stage * a.params_per_layer + a.vocab * a.hidden) / plan.tp
    nd = plan.dp * plan.cp  # distributed optimizer shards over DP x CP
    weight_b = 2.0 + (1.0 if job.precision in LOW_PRECISION else 0.0)
    if job.precision == "fp32":
        weight_b = 4.0
    grad_b = 4.0 if job.precision == "fp32" else 2.0
    opt_b = 12.0  # fp32 master weights + Adam m and v
    zero = plan.zero
    weights = params * weight_b / (nd if zero >= 3 else 1)
    grads = params * grad_b / (nd if zero >= 2 else 1)
    optim = params * opt_b / (nd if zero >= 1 else 1)
    tokens_mb = plan.mbs * job.seq_len / plan.cp
    in_flight = min(plan.pp, max(1, job.global_batch // (plan.dp * plan.mbs)))
    if plan.vp > 1 and plan.pp > 1:
        in_flight = in_flight * (1 + (plan.pp - 1) / (plan.pp * plan.vp))
    act = _act_bytes_per_token_layer(a, plan.recompute) * tokens_mb / plan.tp * layers_stage * in_flight
    if plan.recompute == "full":
        act += _act_bytes_per_token_layer(a, "none") * tokens_mb / plan.tp  # one layer re-materialised
    logits = 4.0 * tokens_mb * a.vocab / plan.tp if plan.pp == 1 else 0.0
    return {
        "weights": weights,
        "gradients": grads,
        "optimizer": optim,
        "activations": act,
        "logits": logits,
        "runtime": RUNTIME_RESERVE_BYTES,
    }


def _matmul_rate(gpu: GPUSpec, precision: TrainPrecision) -> float:
    """Achievable dense matmul FLOP/s."""
    prec = tensor_precision(precision)
    eff = gpu.matmul_efficiency.get(prec, DEFAULT_MATMUL_EFFICIENCY)
    return gpu.peak_tflops(prec) * 1e12 * eff * SUSTAINED_CLOCK_FACTOR


def step_time(job: TrainJob, plan: Plan, gpu: GPUSpec, n_gpus: int, group: GroupFn) -> TrainEstimate:
    """Predict one optimizer step of `job` under `plan` on `n_gpus` GPUs laid out as `group` describes."""
    a = job.arch
    p = plan
    if min(p.tp, p.pp, p.cp, p.dp, p.vp, p.mbs) < 1:
        raise PlanError("tp, pp, cp, dp, vp and mbs must all be at least 1")
    if job.global_batch < 1 or job.seq_len < 1:
        raise PlanError("global batch and sequence length must be at least 1")
    if p.tp * p.pp * p.cp * p.dp != n_gpus:
        raise PlanError(f"tp*pp*cp*dp = {p.tp * p.pp * p.cp * p.dp} != {n_gpus} GPUs")
    if job.global_batch % (p.dp * p.mbs):
        raise PlanError(f"global batch {job.global_batch} is not a multiple of dp*mbs = {p.dp * p.mbs}")
    if a.layers % (p.pp * p.vp) and p.pp > 1:
        raise PlanError(f"{a.layers} layers do not split into pp*vp = {p.pp * p.vp} chunks")
    if a.heads % p.tp or (a.kv_heads % p.tp and p.tp % a.kv_heads):
        raise PlanError(f"{a.heads} heads / {a.kv_heads} KV heads do not split over tp={p.tp}")
    if job.seq_len % (2 * p.cp) and p.cp > 1:
        raise PlanError(f"sequence length {job.seq_len} does not split into 2*cp = {2 * p.cp} chunks")
    m = job.global_batch // (p.dp * p.mbs)  # micro-batches per pipeline per step
    if p.pp > 1 and p.vp > 1 and m % p.pp:
        raise PlanError(f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp ({p.pp})")

    mm_rate = _matmul_rate(gpu, job.precision)
    attn_rate = (
        _matmul_rate(gpu, "bf16" if job.precision in (*LOW_PRECISION, "bf16") else job.precision) * ATTENTION_VS_MATMUL
    )
    hbm = gpu.mem_bw_GBps * 1e9 * HBM_EFFICIENCY
    act_b = 4 if job.precision == "fp32" else 2

    tokens = p.mbs * job.seq_len / p.cp  # tokens each CP rank processes per micro-batch
    layers_stage = a.layers / p.pp

    # -- per layer, per micro-batch, on one GPU -------------------------------------------------------
    t_lin = _gemm_time(_layer_gemms(a, tokens, p.tp), mm_rate, gpu.sms)
    # causal: half the s×s products; flash attention's backward recomputes QK^T, so fwd+bwd is 3.5x fwd
    attn_flops = 3.5 * 4 * job.seq_len * a.hidden * tokens / 2 / p.tp
    t_attn = attn_flops / attn_rate
    elem_bytes = 3 * (10 * a.hidden + (3 if a.gated_mlp else 2) * a.ffn) * act_b * tokens / p.tp
    if job.precision in LOW_PRECISION:
        elem_bytes *= 1.5  # cast/transposes of every GEMM input to fp8
    t_elem = elem_bytes / hbm
    t_launch = KERNELS_PER_LAYER * KERNEL_OVERHEAD_US * 1e-6
    recompute_frac = {"none": 0.0, "selective": 0.0, "full": 1.0 / 3.0}[p.recompute]
    t_recompute = recompute_frac * (t_lin + t_attn + t_elem)

    t_tp = 0.0
    if p.tp > 1:
        tp_group = group(1, p.tp)
        size = int(tokens * a.hidden * act_b)  # sequence-parallel all-gather / reduce-scatter buffer
        ag = collectives.estimate("all_gather", size, tp_group).time_us * 1e-6
        rs = collectives.estimate("reduce_scatter", size, tp_group).time_us * 1e-6
        n_coll = 8 + (4 if p.recompute == "full" else 0)
        per = (ag + rs) / 2
        gemm_adjacent = t_lin / 12  # 4 GEMMs x (fwd, dgrad, wgrad)
        t_tp = n_coll * (max(0.0, per - gemm_adjacent) + per / p.tp)

    t_cp = 0.0
    if p.cp > 1:
        cp_group = group(p.tp, p.cp)
        kv_bytes = int(tokens * 2 * a.kv_heads * a.head_dim * act_b / min(p.tp, a.kv_heads))
        hop = collectives.estimate("send_recv", kv_bytes, cp_group).time_us * 1e-6
        t_cp = max(0.0, 3 * (p.cp - 1) * hop - t_attn)

    t_layer = t_lin + t_attn + t_elem + t_launch + t_recompute + t_tp + t_cp
    logits = [
        (tokens, a.vocab / p.tp, a.hidden),
        (tokens, a.hidden, a.vocab / p.tp),
        (a.hidden, a.vocab / p.tp, tokens),
    ]
    t_logits = _gemm_time(logits, mm_rate, gpu.sms) + 3 * tokens * a.vocab * 4 / p.tp / hbm
    t_mb = layers_stage * t_layer + (t_logits if p.pp == 1 else 0.0)  # a typical stage
    t_mb_slowest = layers_stage * t_layer + t_logits  # the last stage also computes the logits

    t_pp = 0.0
    if p.pp > 1:
        pp_group = group(p.tp * p.cp * p.dp, 2)
        act_bytes = int(tokens * a.hidden * act_b / p.tp)
        hop = collectives.estimate("send_recv", act_bytes, pp_group).time_us * 1e-6
        t_pp = 2 * (p.pp * p.vp - 1) * hop  # activations and gradients along the critical path
    bubble = (p.pp - 1) / p.vp * t_mb if p.pp > 1 else 0.0
    t_pipeline = m * t_mb_slowest + bubble + t_pp

    # -- data parallel -----------------------------------------------------------------------------
    nd = p.dp * p.cp
    t_dp = 0.0
    if nd > 1:
        dp_group = group(p.tp, nd)  # Megatron order tp-cp-dp: the DP x CP group is strided by tp
        params_gpu = (layers_stage * a.params_per_layer + a.vocab * a.hidden) / p.tp
        grad_bytes = int(params_gpu * 4)  # gradients are reduced in fp32 (Megatron main_grad)
        param_bytes = int(params_gpu * act_b)
        if p.zero >= 3:
            ag = collectives.estimate("all_gather", param_bytes, dp_group).time_us * 1e-6
            rs = collectives.estimate("reduce_scatter", param_bytes, dp_group).time_us * 1e-6
            per_mb = 2 * ag + rs  # gather for forward and backward, reduce gradients, every micro-batch
            t_dp = m * max(0.0, per_mb - t_mb)
        else:
            rs = collectives.estimate("reduce_scatter" if p.zero >= 1 else "all_reduce", grad_bytes, dp_group)
            ag = collectives.estimate("all_gather", param_bytes, dp_group) if p.zero >= 1 else None
            t_rs = rs.time_us * 1e-6
            t_ag = ag.time_us * 1e-6 if ag else 0.0
            t_dp = max(0.0, t_rs - GRAD_BUCKETS_EXPOSED * 2 / 3 * t_mb) + max(0.0, t_ag - t_mb / 3)
    params_shard = (layers_stage * a.params_per_layer + a.vocab * a.hidden) / p.tp / (nd if p.zero >= 1 else 1)
    t_opt = params_shard * 32 / hbm  # read+write master, m, v, grad; write bf16 weight

    step = t_pipeline + t_dp + t_opt
    total_tokens = job.global_batch * job.seq_len
    model_flops = a.model_flops_per_token(job.seq_len) * total_tokens
    peak = gpu.peak_tflops(tensor_precision(job.precision)) * 1e12
    achieved = model_flops / step / n_gpus
    mem = memory_per_gpu(job, p, gpu)
    mem_total = sum(mem.values())
    per_step = m
    breakdown = {
        "compute_linear": per_step * layers_stage * t_lin + per_step * t_logits,
        "compute_attention": per_step * layers_stage * t_attn,
        "elementwise": per_step * layers_stage * (t_elem + t_launch),
        "recompute": per_step * layers_stage * t_recompute,
        "tp_exposed": per_step * layers_stage * t_tp,
        "cp_exposed": per_step * layers_stage * t_cp,
        "pp_bubble": bubble,
        "pp_p2p": t_pp,
        "dp_exposed": t_dp,
        "optimizer": t_opt,
    }
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
    )
