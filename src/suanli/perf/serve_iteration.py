"""LLM serving: the time of one engine iteration under continuous batching.

One iteration runs every active sequence's next decode token together with the prefill tokens of newly admitted
requests (in-flight batching). Its time on one GPU is the sum, layer by layer, of

* GEMMs, each at the slower of its FLOPs at the achievable matmul rate (wave-quantised, as in training) and its
  weight bytes at achievable HBM bandwidth: decode is weight-bandwidth bound, big batches and prefill compute bound;
  MoE layers read only the experts the batch's tokens reach (E·(1-(1-k/E)^T)) and compute k experts per token;
* attention: decode reads every sequence's KV cache (GQA heads or MLA latent) at HBM bandwidth; prefill is causal
  flash attention at a fixed fraction of the matmul rate;
* communication: two all-reduces per layer over the TP group (attention and MLP outputs), costed by
  `collectives.estimate` on the GPUs that form it; with attention data-parallel inside a stage (tp < GPUs per
  stage) MoE tokens travel to their experts and back by all-to-all over the stage;
* element-wise kernels at HBM bandwidth, a launch cost per kernel, the LM head and its FP32 logits.

`perf.inference` finds the steady state (or a finite run) of these iterations. Pure.
"""

from __future__ import annotations

import math

from suanli.catalog import GPUSpec
from suanli.perf import collectives
from suanli.perf.layers import KERNEL_OVERHEAD_US, TILE_M, TILE_N
from suanli.perf.serve_shape import (
    ACT_BYTES,
    EMBEDDING_BYTES,
    KV_BYTES,
    MATMUL_PRECISION,
    WEIGHT_BYTES,
    Layout,
    ServePrecision,
    ServeShape,
)
from suanli.perf.training import DEFAULT_MATMUL_EFFICIENCY, HBM_EFFICIENCY, SUSTAINED_CLOCK_FACTOR, GroupFn

# ---- serving engine facts (TensorRT-LLM defaults; none fitted to a measurement) ------------------------------
# forward-only flash attention vs the GEMM rate (FA3 forward on H100 reaches ~70% of its dense BF16 peak)
ATTENTION_FWD_VS_MATMUL = 0.75
KERNELS_PER_LAYER = 12  # fused inference layer: norms, QKV, rope/KV write, attention, O, MLP, all-reduces
ITERATION_OVERHEAD_US = 300.0  # scheduler, sampling and host work per engine iteration
FP4_SPEEDUP = 2.0  # NVFP4 tensor cores run at twice the FP8 rate
# Routed experts run as grouped GEMMs (one problem per expert, FP8 scales per expert) behind routing, permute and
# un-permute kernels; TensorRT-LLM's MoE path reaches about this share of a dense GEMM's rate. A stated assumption,
# set on the tuned MoE rows as a whole (the held-out rows check it), not per row.
MOE_GEMM_EFFICIENCY = 0.70
SMALL_TILE_M = 64  # the smallest M tile of Hopper/Blackwell tensor-core GEMMs (wgmma M = 64)


def _gemm_eff(m: float) -> float:
    """Useful share of tensor-core time of a GEMM with `m` token rows. Inference GEMM kernels (split-K/stream-K)
    spread partial waves over every SM, so what is lost is the padding of M to a 64-row tile: a whole tile below
    64 rows, and on average half a tile above (batch sizes and per-expert token counts vary from step to step),
    which keeps the cost monotone in the batch."""
    return m / max(SMALL_TILE_M, m + SMALL_TILE_M / 2)


def _grouped_wave_eff(groups: float, rows: float, widths: tuple[float, ...], sms: int) -> float:
    """Share of the SMs a grouped GEMM (one problem per expert, no split-K) keeps busy: its output tiles
    (128 x 256, as in training) over whole waves of the GPU's SMs, the last wave half full on average; the mean over
    the GEMMs of `widths` (their N)."""
    out = 0.0
    for n in widths:
        tiles = groups * max(1.0, rows / TILE_M) * math.ceil(n / TILE_N)
        waves = tiles / sms
        out += waves / max(1.0, waves + 0.5)
    return out / len(widths)


class Engine:
    """Precomputed rates and per-layer sizes of one (model, GPU, layout, precision); costs iterations."""

    def __init__(self, s: ServeShape, gpu: GPUSpec, lay: Layout, precision: ServePrecision, group: GroupFn) -> None:
        self.s, self.gpu, self.lay, self.precision, self.group = s, gpu, lay, precision, group
        prec = MATMUL_PRECISION[precision]
        eff = gpu.matmul_efficiency.get(prec, DEFAULT_MATMUL_EFFICIENCY)  # type: ignore[call-overload]
        self.mm_rate = gpu.peak_tflops(prec) * 1e12 * eff * SUSTAINED_CLOCK_FACTOR  # type: ignore[arg-type]
        if precision == "fp4":
            self.mm_rate *= FP4_SPEEDUP
        bf16 = "bf16" if gpu.tflops.get("bf16") else "fp16"
        bf_eff = gpu.matmul_efficiency.get(bf16, DEFAULT_MATMUL_EFFICIENCY)  # type: ignore[call-overload]
        self.attn_rate = gpu.peak_tflops(bf16) * 1e12 * bf_eff * SUSTAINED_CLOCK_FACTOR * ATTENTION_FWD_VS_MATMUL
        self.hbm = gpu.mem_bw_GBps * 1e9 * HBM_EFFICIENCY
        self.wb = WEIGHT_BYTES[precision]
        tp, h = lay.tp, s.hidden
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        # (n, k) of each weight matrix on one GPU: attention, Mamba mixer, dense MLP, shared experts
        if not s.kv_latent and s.attn_params == 2 * h * q + 2 * h * kv:
            self.attn_gemms = [((q + 2 * kv) / tp, h), (h, q / tp)]
        else:  # MLA: its projections as one GEMM of their total size
            self.attn_gemms = [(s.attn_params / h / tp, h)]
        self.mamba_gemms = [(s.mamba_params / h / tp, h)] if s.mamba_params else []
        up = s.mlp_mult - 1
        self.dense_mlp = [(up * s.ffn / tp, h), (h, s.ffn / tp)]
        self.shared_mlp = [(up * s.shared_ffn / tp, h), (h, s.shared_ffn / tp)] if s.shared_ffn else []
        if s.is_moe:
            self.shared_mlp.append((s.experts, h))  # the router
        self.kv_layer_bytes = s.kv_elems_per_token_layer(tp) * KV_BYTES[precision]
        # attention work per (query, key) pair and head: QK^T and AV (MLA decode: absorbed, over the latent)
        self.pair_flops = 2 * (s.head_dim + s.v_dim)
        self.decode_pair_flops = 2 * (2 * s.kv_latent) if s.kv_latent else self.pair_flops
        self.n_layers = math.ceil(s.layers / lay.pp)
        self.n_attn = math.ceil(s.attn_layers / lay.pp)
        self.n_mamba = math.ceil(s.mamba_layers / lay.pp)
        self.n_moe = math.ceil(s.moe_layers / lay.pp)
        self.n_dense = math.ceil(s.dense_layers / lay.pp)
        self._coll: dict[tuple[str, int, int], float] = {}

    # -- pieces -------------------------------------------------------------------------------------------------
    def _gemms(self, shapes: list[tuple[float, float]], tokens: float) -> tuple[float, float]:
        """(compute-bound seconds, memory-bound seconds) of GEMMs over `tokens` rows: each at its own roofline."""
        comp = mem = 0.0
        for n, k in shapes:
            tc = 2 * tokens * n * k / (self.mm_rate * _gemm_eff(max(tokens, 1.0)))
            tm = (n * k * self.wb + tokens * (n + k) * ACT_BYTES) / self.hbm
            if tc >= tm:
                comp += tc
            else:
                mem += tm
        return comp, mem

    def _moe(self, tokens: float) -> tuple[float, float]:
        """One MoE layer's routed experts on one GPU, `tokens` per attention replica."""
        s, lay = self.s, self.lay
        group_tokens = tokens * lay.attn_dp  # every replica of the stage routes into the same experts
        local = s.experts / lay.ep
        touched = local * (1.0 - (1.0 - s.top_k / s.experts) ** group_tokens)
        rows = group_tokens * s.top_k / lay.ep  # token-expert pairs this GPU computes
        if rows <= 0 or touched <= 0:  # an iteration with no token for these experts (a finite run's last steps)
            return 0.0, 0.0
        n_up = (2 if s.gated else 1) * s.expert_ffn / lay.etp
        n_down = s.hidden
        k_down = s.expert_ffn / lay.etp
        per_expert = rows / max(touched, 1e-9)
        flops = 2 * rows * (n_up * s.hidden + n_down * k_down)
        eff = _gemm_eff(max(per_expert, 1.0)) * _grouped_wave_eff(touched, per_expert, (n_up, n_down), self.gpu.sms)
        tc = flops / (self.mm_rate * eff * MOE_GEMM_EFFICIENCY)
        tm = (touched * (n_up * s.hidden + n_down * k_down) * self.wb + rows * 4 * s.hidden * ACT_BYTES) / self.hbm
        return (tc, 0.0) if tc >= tm else (0.0, tm)

    def _collective(self, op: str, size: float, group_size: int, stride: int) -> float:
        b = max(1, int(size))
        key = (op, group_size, b.bit_length() * 4 + ((b << 2 >> (b.bit_length() - 1)) & 3 if b > 1 else 0))
        t = self._coll.get(key)
        if t is None:
            t = collectives.estimate(op, b, self.group(stride, group_size)).time_us * 1e-6  # type: ignore[arg-type]
            self._coll[key] = t
        return t

    def stage_time(self, dec: float, ctx: float, pre: float, pre_len: float) -> dict[str, float]:
        """Seconds of one iteration of one pipeline stage, by kind: `dec` decode tokens at mean context `ctx`
        and `pre` prefill tokens of prompts `pre_len` long, per attention replica."""
        s, lay = self.s, self.lay
        tokens = dec + pre
        out = {"compute": 0.0, "memory": 0.0, "communication": 0.0, "overhead": 0.0}

        def add(pair: tuple[float, float], times: float) -> None:
            out["compute"] += pair[0] * times
            out["memory"] += pair[1] * times

        add(self._gemms(self.attn_gemms, tokens), self.n_attn)
        if self.n_mamba:
            add(self._gemms(self.mamba_gemms, tokens), self.n_mamba)
        add(self._gemms(self.dense_mlp, tokens), self.n_dense)
        if self.n_moe:
            add(self._gemms(self.shared_mlp, tokens), self.n_moe)
            add(self._moe(tokens), self.n_moe)
        heads = s.heads / lay.tp
        # decode attention: read the KV cache; prefill: causal flash attention over each prompt
        kv_layers = s.kv_layers_at(ctx) / max(s.attn_layers, 1) * self.n_attn
        d_comp = dec * ctx * heads * self.decode_pair_flops / self.attn_rate
        d_mem = dec * ctx * self.kv_layer_bytes / self.hbm
        add((d_comp, 0.0) if d_comp > d_mem else (0.0, d_mem), kv_layers)
        keys = pre_len / 2 if not s.window else min(pre_len / 2, s.window)
        out["compute"] += self.n_attn * pre * keys * heads * self.pair_flops / self.attn_rate
        ffn_act = s.ffn if not s.is_moe else s.top_k * s.expert_ffn + s.shared_ffn
        out["memory"] += self.n_layers * tokens * (10 * s.hidden + 3 * ffn_act / lay.tp) * ACT_BYTES / self.hbm
        out["overhead"] += self.n_layers * KERNELS_PER_LAYER * KERNEL_OVERHEAD_US * 1e-6
        comm = 0.0
        if lay.tp > 1:
            ar = self._collective("all_reduce", tokens * s.hidden * ACT_BYTES, lay.tp, 1)
            # one after each mixer and each MLP; an MoE block's outputs travel by all-to-all when attention is
            # data-parallel inside the stage
            comm += ar * (self.n_attn + self.n_mamba + self.n_dense + (0 if lay.attn_dp > 1 else self.n_moe))
        if self.n_moe and lay.attn_dp > 1:
            size = tokens * s.top_k * s.hidden * ACT_BYTES
            if lay.ep > 1:
                a2a = self._collective("all_to_all", size, lay.stage_gpus, 1)
                comm += 2 * a2a * self.n_moe
            else:
                ag = self._collective("all_gather", tokens * s.hidden * ACT_BYTES * lay.attn_dp, lay.stage_gpus, 1)
                comm += 2 * ag * self.n_moe
        out["communication"] = comm
        return out

    def head_time(self, dec: float, pre_seqs: float) -> float:
        """LM head on the last stage: the GEMM for every sequence's next token and its FP32 logits."""
        s, lay = self.s, self.lay
        rows = dec + pre_seqs
        n = s.vocab / lay.tp
        tc = 2 * rows * n * s.hidden / (self.mm_rate * _gemm_eff(max(rows, 1.0)))
        tm = (n * s.hidden * EMBEDDING_BYTES + rows * n * 4 * 2) / self.hbm
        return max(tc, tm)

    def iteration(self, batch: float, ctx: float, pre: float, pre_len: float) -> dict[str, float]:
        """One token step of `batch` sequences through every stage (pp micro-batches of batch/pp each)."""
        pp = self.lay.pp
        st = self.stage_time(batch / pp, ctx, pre / pp, pre_len)
        parts = {k: v * pp for k, v in st.items()}
        parts["memory"] += self.head_time(batch / pp, pre / pp / max(pre_len, 1.0))
        if pp > 1:
            hop = self._collective("send_recv", (batch + pre) / pp * self.s.hidden * ACT_BYTES, 2, self.lay.stage_gpus)
            parts["communication"] += (pp - 1) * hop
        parts["overhead"] += ITERATION_OVERHEAD_US * 1e-6
        return parts
