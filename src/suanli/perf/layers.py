"""Time of one layer's forward + backward on one GPU, by layer kind (attention or Mamba mixer; dense MLP or MoE).

Every GEMM (forward, input gradient, weight gradient) runs at the GPU's achievable rate, divided by its
wave-quantisation efficiency; attention at a fraction of the matmul rate; element-wise kernels at HBM speed;
each kernel pays a launch/tail cost; TP, EP collectives are costed on the group the plan forms and only their
exposed part counted.

Mixture of Experts (Megatron's all-to-all token dispatcher): every token goes to `top_k` experts; an EP rank
holds `experts / ep` of them and, with the routing balanced, receives as many (token, expert) rows as it sends:
`tokens · top_k · imbalance` (the busiest rank sets the pace: `imbalance` = its load / the mean). Rows travel
as a dispatch all-to-all before the expert GEMMs and a combine all-to-all after them, forward and backward
(4 per layer per micro-batch), over the EP group's real GPUs: inside one NVLink domain at NVLink speed,
across domains at each GPU's NIC share (`collectives.estimate`). The experts run as a grouped GEMM of
`rows / local experts` rows each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from suanli.perf import collectives
from suanli.perf.models import Ffn, Mixer, TransformerArch
from suanli.topology.model import CommGroup

TILE_M, TILE_N = 128, 256
KERNEL_OVERHEAD_US = 5.0  # launch gap + tail effect per kernel
KERNELS_PER_SUBLAYER = 50  # forward + backward kernels of one mixer or one MLP (norms, GEMMs, attention, casts)
# an MoE block adds router GEMM, score function, top-k, permute/unpermute, dispatch/combine and their
# backward: ~30 kernels forward, ~2x backward (Megatron MoE layer profile, estimate)
MOE_EXTRA_KERNELS = 90
SSD_CHUNK = 256  # Mamba-2 chunked scan: intra-chunk quadratic part over 256-token chunks
HDIM64_ATTENTION_EFFICIENCY = 0.77  # flash attention at head dim 64 vs 128 (FlashAttention-3 paper, fig. 5)
# SMs the dispatch/combine kernels hold while they run beside compute (EP all-to-all overlap): Megatron-Bridge's
# benchmark setup gives HybridEP 32 (`moe_hybridep_num_sms = 32`, scripts/performance/utils/overrides.py)
EP_COMM_SMS = 32


def gemm_efficiency(m: float, n: float, sms: int) -> float:
    """Useful fraction of the SM-time a GEMM with an m x n output occupies (partial tiles, last wave)."""
    tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    waves = math.ceil(tiles / sms)
    return (m * n) / (waves * sms * TILE_M * TILE_N)


def gemm_time(shapes: list[tuple[float, float, float]], rate: float, sms: int) -> float:
    """Seconds for GEMMs given as (m, n, k) at an achievable `rate` FLOP/s before wave quantisation."""
    return sum(2 * m * n * k / (rate * gemm_efficiency(m, n, sms)) for m, n, k in shapes if m > 0 and n > 0)


def fwd_bwd(fwd: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """Forward GEMMs plus their input-gradient and weight-gradient GEMMs."""
    return fwd + [(m, k, n) for m, n, k in fwd] + [(k, n, m) for m, n, k in fwd]


@dataclass(frozen=True)
class LayerEnv:
    """What every layer of one micro-batch on one GPU shares."""

    arch: TransformerArch
    seq_len: int
    tokens: float  # tokens per CP rank per micro-batch
    tp: int
    cp: int
    ep: int
    etp: int
    mm_rate: float
    attn_rate: float
    hbm: float
    sms: int
    act_b: int
    low_precision: bool
    full_recompute: bool
    imbalance: float
    group: Callable[[int, int], CommGroup]
    flex_dispatch: bool = True  # DeepEP/HybridEP (once per remote domain) or a plain all-to-all (every pair)
    recompute_modules: frozenset[str] = frozenset()  # selective recompute (Megatron `recompute_modules`)


@dataclass
class LayerTime:
    linear: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0
    recompute: float = 0.0
    tp: float = 0.0
    cp: float = 0.0
    ep: float = 0.0
    launch: float = 0.0
    tp_linear: float = 0.0  # GEMM time of the sublayers whose inputs are TP all-gathered (for overlap)
    tp_sublayers: int = 0
    # the part of `ep` still exposed when this layer's all-to-alls run beside another micro-batch's compute of
    # the same layer (EP all-to-all overlap, `ep_overlapped`); not part of `total`
    ep_paired: float = 0.0

    FIELDS = ("linear", "attention", "elementwise", "recompute", "tp", "cp", "ep", "launch")

    @property
    def total(self) -> float:
        return sum(getattr(self, k) for k in self.FIELDS)

    def add(self, other: LayerTime) -> None:
        for k in (*self.FIELDS, "tp_linear", "tp_sublayers", "ep_paired"):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def scaled(self, f: float) -> LayerTime:
        return LayerTime(**{k: getattr(self, k) * f for k in (*self.FIELDS, "ep_paired")})


def _attn_gemms(a: TransformerArch, t: float, tp: int) -> list[tuple[float, float, float]]:
    h = a.hidden
    if a.is_mla:
        q_out = a.heads * a.qk_head_dim / tp
        q = [(t, a.q_lora_rank, h), (t, q_out, a.q_lora_rank)] if a.q_lora_rank else [(t, q_out, h)]
        kv = [
            (t, a.kv_lora_rank + a.qk_rope_dim, h),
            (t, a.heads * (a.qk_nope_dim + a.v_head_dim) / tp, a.kv_lora_rank),
        ]
        return q + kv + [(t, h, a.heads * a.v_head_dim / tp)]
    hd = a.head_dim
    return [(t, (a.heads + 2 * a.kv_heads) * hd / tp, h), (t, h, a.heads * hd / tp)]


def _mamba_gemms(a: TransformerArch, t: float, tp: int) -> list[tuple[float, float, float]]:
    h, di = a.hidden, a.mamba_expand * a.hidden
    gn, nh = a.mamba_groups * a.mamba_state, di // a.mamba_head_dim
    return [(t, (2 * di + 2 * gn + nh) / tp, h), (t, h, di / tp)]


def _mlp_gemms(a: TransformerArch, t: float, tp: int, ffn: int) -> list[tuple[float, float, float]]:
    up = (2 if a.gated_mlp else 1) * ffn
    return [(t, up / tp, a.hidden), (t, a.hidden, ffn / tp)]


def _tp_exposed(env: LayerEnv, t_lin: float, sublayers: int) -> float:
    """Sequence-parallel all-gather/reduce-scatter pairs around each TP sublayer (4 per sublayer, 6 under full
    recompute), each overlapped with the adjacent GEMM (of 6 per sublayer: 2 x fwd, dgrad, wgrad) except its
    first chunk."""
    if env.tp <= 1 or sublayers == 0:
        return 0.0
    g = env.group(1, env.tp)
    size = int(env.tokens * env.arch.hidden * env.act_b)
    ag = collectives.estimate("all_gather", size, g).time_us * 1e-6
    rs = collectives.estimate("reduce_scatter", size, g).time_us * 1e-6
    per = (ag + rs) / 2
    adjacent = t_lin / (6 * sublayers)
    n_coll = sublayers * (6 if env.full_recompute else 4)
    return n_coll * (max(0.0, per - adjacent) + per / env.tp)


def head_dim_efficiency(qk_head_dim: int) -> float:
    """Flash-attention throughput relative to 128-dim heads: a 64-dim head does half the work per loaded K/V
    tile, so the softmax and memory traffic weigh more. FlashAttention-3 (Shah et al. 2024, fig. 5, H100 BF16
    forward at 16k tokens): 497 TFLOPS at head dim 64 vs 648 at 128 (0.77). Linear in between; 1.0 from 128 up."""
    if qk_head_dim >= 128:
        return 1.0
    return HDIM64_ATTENTION_EFFICIENCY + (1 - HDIM64_ATTENTION_EFFICIENCY) * max(0, qk_head_dim - 64) / 64


def mixer_time(env: LayerEnv, mixer: Mixer) -> LayerTime:
    a, t, tp = env.arch, env.tokens, env.tp
    out = LayerTime()
    if mixer == "none":
        return out
    elem_units = 6 * a.hidden  # norm, projections in/out, residual
    if mixer == "attn":
        out.linear = gemm_time(fwd_bwd(_attn_gemms(a, t, tp)), env.mm_rate, env.sms)
        per_key = 2 * a.heads * (a.qk_head_dim + a.v_dim)
        seq_eff = env.seq_len / 2  # causal: half the (query, key) pairs
        flops = 3.5 * per_key * seq_eff * t / tp  # flash attention fwd+bwd = 3.5x forward (bwd recomputes QK^T)
        out.attention = flops / (env.attn_rate * head_dim_efficiency(a.qk_head_dim))
        if env.cp > 1:
            g = env.group(tp, env.cp)
            kv = int(t * 2 * a.kv_heads * a.head_dim * env.act_b / min(tp, a.kv_heads))
            hop = collectives.estimate("send_recv", kv, g).time_us * 1e-6
            out.cp = max(0.0, 3 * (env.cp - 1) * hop - out.attention)
    else:  # Mamba-2 SSD: projections as GEMMs, the chunked scan like attention over a 256-token window
        out.linear = gemm_time(fwd_bwd(_mamba_gemms(a, t, tp)), env.mm_rate, env.sms)
        di = a.mamba_expand * a.hidden
        out.attention = 3.5 * (4 * di * a.mamba_state + 2 * di * SSD_CHUNK) * t / tp / env.attn_rate
        elem_units += 4 * di
    out.elementwise = 3 * elem_units * env.act_b * t / tp / env.hbm * (1.5 if env.low_precision else 1.0)
    out.launch = KERNELS_PER_SUBLAYER * KERNEL_OVERHEAD_US * 1e-6
    out.tp_linear, out.tp_sublayers = out.linear, 1
    if env.full_recompute:
        out.recompute = (out.linear + out.attention + out.elementwise) / 3
    else:
        out.recompute = _selective_mixer(env, mixer)
    return out


def _selective_mixer(env: LayerEnv, mixer: Mixer) -> float:
    """Forward work Megatron's selective `recompute_modules` repeat in the backward of a mixer: `mla_up_proj` (the
    MLA query and key/value up-projections) and `layernorm` (the input norm: read and write the hidden state)."""
    a, t, tp, mods = env.arch, env.tokens, env.tp, env.recompute_modules
    extra = 0.0
    if "mla_up_proj" in mods and mixer == "attn" and a.is_mla:
        up = [(t, a.heads * (a.qk_nope_dim + a.v_head_dim) / tp, a.kv_lora_rank)]
        if a.q_lora_rank:
            up.append((t, a.heads * a.qk_head_dim / tp, a.q_lora_rank))
        extra += gemm_time(up, env.mm_rate, env.sms)
    if "layernorm" in mods:
        extra += 2 * a.hidden * env.act_b * t / tp / env.hbm
    return extra


def ffn_time(env: LayerEnv, ffn: Ffn) -> LayerTime:
    a, t, tp = env.arch, env.tokens, env.tp
    out = LayerTime()
    if ffn == "none":
        return out
    mult = 3 if a.gated_mlp else 2
    if ffn == "dense":
        out.linear = gemm_time(fwd_bwd(_mlp_gemms(a, t, tp, a.ffn)), env.mm_rate, env.sms)
        units = 4 * a.hidden + mult * a.ffn
        out.tp_linear, out.tp_sublayers = out.linear, 1
    else:
        rows = t / tp * a.top_k * env.imbalance  # (token, expert) rows the busiest EP rank computes
        local = a.experts / env.ep
        per_expert = rows * env.etp / local
        shapes = fwd_bwd(_mlp_gemms(a, per_expert, env.etp, a.moe_ffn))
        out.linear = local * gemm_time(shapes, env.mm_rate, env.sms)
        if a.shared_experts:
            sh = fwd_bwd(_mlp_gemms(a, t, tp, a.shared_experts * (a.shared_ffn or a.moe_ffn)))
            out.linear += gemm_time(sh, env.mm_rate, env.sms)
        out.linear += gemm_time(fwd_bwd([(t / tp, a.experts, a.hidden)]), env.mm_rate, env.sms)  # router
        units = (4 * a.hidden + a.shared_experts * mult * (a.shared_ffn or a.moe_ffn)) / tp
        units += rows / t * (mult * a.moe_ffn / env.etp + 4 * a.hidden)  # expert activations, permute/unpermute
        units *= tp  # (the common factor t / tp is applied below)
        out.launch += MOE_EXTRA_KERNELS * KERNEL_OVERHEAD_US * 1e-6
        out.ep = moe_alltoall_time(env, rows)
    out.elementwise += 3 * units * env.act_b * t / tp / env.hbm * (1.5 if env.low_precision else 1.0)
    out.launch += KERNELS_PER_SUBLAYER * KERNEL_OVERHEAD_US * 1e-6
    if env.full_recompute:
        out.recompute = (out.linear + out.elementwise) / 3
    else:
        out.recompute = _selective_ffn(env, ffn)
    return out


def _selective_ffn(env: LayerEnv, ffn: Ffn) -> float:
    """Forward work the selective `recompute_modules` repeat for an MLP: `mlp` (a dense MLP's forward GEMMs and
    activation), `moe_act` (the routed experts' activation: read the gated input, write its output), `layernorm`
    (the pre-MLP norm)."""
    a, t, tp, mods = env.arch, env.tokens, env.tp, env.recompute_modules
    mult = 3 if a.gated_mlp else 2
    extra = 0.0
    if "mlp" in mods and ffn == "dense":
        extra += gemm_time(_mlp_gemms(a, t, tp, a.ffn), env.mm_rate, env.sms)
        extra += mult * a.ffn * env.act_b * t / tp / env.hbm
    if "moe_act" in mods and ffn == "moe":
        rows = t / tp * a.top_k * env.imbalance
        extra += rows * mult * a.moe_ffn / env.etp * env.act_b / env.hbm
    if "layernorm" in mods and ffn != "none":
        extra += 2 * a.hidden * env.act_b * t / tp / env.hbm
    return extra


def remote_domain_copies(experts: int, top_k: int, domains: int) -> float:
    """Expected distinct other NVLink domains one token's top-k experts fall in (experts spread evenly, k
    drawn without replacement): what crosses the network when the dispatcher sends a token once per domain."""
    if domains <= 1:
        return 0.0
    per = experts / domains
    p_none = 1.0
    for i in range(min(top_k, experts)):
        p_none *= max(0.0, (experts - per - i) / (experts - i))
    return (domains - 1) * (1.0 - p_none)


def moe_alltoall_time(env: LayerEnv, rows: float) -> float:
    """Dispatch + combine all-to-alls, forward and backward (and the forward again under full recompute).

    Across NVLink domains the dispatcher (DeepEP / HybridEP, what NVIDIA's MoE recipes run) sends a token once
    per destination domain and fans it out over NVLink there (DeepSeek-V3 report, sec. 3.2.2; DeepEP's
    internode kernels), so the network carries `remote_domain_copies` copies of each token instead of the
    `top_k * (domains-1)/domains` a plain all-to-all would. Megatron's `alltoall` dispatcher (what a recipe
    without a flex backend runs) sends every (token, expert) pair: `env.flex_dispatch` False."""
    if env.ep <= 1:
        return 0.0
    g = env.group(env.etp, env.ep)
    a = env.arch
    size = rows * a.hidden * 2  # rows travel in 16 bits
    if env.flex_dispatch and g.domains > 1 and a.top_k > 1:
        plain = a.top_k * (g.domains - 1) / g.domains
        size *= min(1.0, remote_domain_copies(a.experts, a.top_k, g.domains) / plain)
    one = collectives.estimate("all_to_all", int(size), g).time_us * 1e-6
    return one * (4 + (2 if env.full_recompute else 0))


def ep_overlapped(comm: float, mixer: float, ffn: float, sms: int) -> float:
    """Exposed time of one layer's `comm` seconds of dispatch/combine (forward and backward) under Megatron's EP
    all-to-all overlap (`overlap_moe_expert_parallel_comm`): the forward of one micro-batch is merged with the
    backward of another layer by layer, and each of the four all-to-alls runs on a second stream beside one
    compute chunk of the other micro-batch (forward dispatch beside the experts' backward, forward combine beside
    the attention backward, backward dispatch beside the experts' forward, backward combine beside the attention
    forward; forward = 1/3 of a sublayer's compute, backward 2/3). What its chunk cannot cover stays exposed;
    while they run together the communication kernels hold `EP_COMM_SMS` SMs, slowing that chunk by their share.
    Never below the compute alone, never above running them one after the other."""
    share = min(1.0, EP_COMM_SMS / sms)
    one = comm / 4
    chunks = (ffn * 2 / 3, mixer * 2 / 3, ffn / 3, mixer / 3)
    return sum(max(0.0, one - c) + share * min(one, c) for c in chunks)


def layer_time(env: LayerEnv, kind: tuple[Mixer, Ffn]) -> LayerTime:
    out = mixer_time(env, kind[0])
    mixer = out.total
    ffn = ffn_time(env, kind[1])
    out.add(ffn)
    out.tp = _tp_exposed(env, out.tp_linear, out.tp_sublayers)
    if out.ep:
        out.ep_paired = ep_overlapped(out.ep, mixer + out.tp / 2, ffn.total - ffn.ep + out.tp / 2, env.sms)
    return out
