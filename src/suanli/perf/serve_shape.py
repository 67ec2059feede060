"""What LLM serving needs to know of an architecture and a parallel layout: weights per GPU, KV cache per token.

A `ServeShape` is derived from a `TransformerArch` (dense, or with the Mixture-of-Experts and MLA fields when the
architecture has them) and is what `perf.serve_iteration` costs. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from suanli.catalog import GPUSpec
from suanli.perf.models import TransformerArch

ServePrecision = Literal["bf16", "fp16", "fp8", "fp4"]
SERVE_PRECISIONS: tuple[ServePrecision, ...] = ("bf16", "fp16", "fp8", "fp4")
# Bytes per weight: NVFP4 stores 4 bits plus one FP8 scale per 16 values.
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1 / 16}
# The KV cache follows the quantization recipe: TensorRT-LLM's FP8 and NVFP4 recipes store it in FP8.
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 1.0}
# The tensor-core rate the GEMMs run at (NVFP4 GEMMs on Blackwell; the catalog has no fp4 column: 2x fp8).
MATMUL_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp4": "fp8"}
ACT_BYTES = 2.0  # activations and the collectives that carry them stay 16-bit
EMBEDDING_BYTES = 2.0  # embedding and LM head are not quantized by the FP8/FP4 recipes


class ServeError(ValueError):
    """A serving configuration that cannot run (with the reason and the flag to change)."""


@dataclass(frozen=True)
class ServeShape:
    """Per-layer sizes a forward pass touches. Counts of each layer kind; MoE fields are zero for a dense model."""

    name: str
    layers: int  # all layers (the pipeline splits these)
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # query/key width per head (MLA: nope + rope)
    v_dim: int
    vocab: int
    attn_layers: int  # layers with an attention mixer (they hold KV cache)
    attn_params: int  # per attention layer
    mamba_layers: int
    mamba_params: int  # per Mamba-2 layer (constant-size state: no KV cache)
    dense_layers: int  # layers with a dense MLP
    ffn: int  # dense FFN inner size
    gated: bool
    moe_layers: int = 0
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0  # total inner size of the always-on shared experts
    kv_latent: int = 0  # MLA: compressed KV (+ decoupled RoPE key) per token per layer, shared by all heads
    window: int = 0  # sliding-window attention: these layers keep at most `window` tokens
    window_layers: int = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def mlp_mult(self) -> int:
        return 3 if self.gated else 2

    @property
    def expert_params(self) -> int:
        return self.mlp_mult * self.hidden * self.expert_ffn

    def kv_elems_per_token_layer(self, tp: int) -> float:
        """KV cache entries one GPU keeps per token and attention layer: each TP rank keeps at least one KV head;
        MLA's latent is not split by heads, so every rank keeps all of it."""
        if self.kv_latent:
            return float(self.kv_latent)
        return math.ceil(self.kv_heads / tp) * (self.head_dim + self.v_dim)

    def kv_layers_at(self, ctx: float) -> float:
        """Attention layers' worth of KV a sequence of `ctx` tokens holds (windowed layers hold at most the
        window), in units of full layers."""
        if not self.window or ctx <= self.window:
            return float(self.attn_layers)
        return self.attn_layers - self.window_layers + self.window_layers * self.window / ctx


def shape_of(arch: TransformerArch) -> ServeShape:
    """The serving view of an architecture (dense, MoE, MLA, sliding-window or hybrid Mamba)."""
    kinds = arch.layer_kinds()
    attn = sum(1 for m, _ in kinds if m == "attn")
    shared = arch.shared_experts * (arch.shared_ffn or arch.moe_ffn)
    return ServeShape(
        name=arch.name,
        layers=arch.layers,
        hidden=arch.hidden,
        heads=arch.heads,
        kv_heads=arch.kv_heads,
        head_dim=arch.qk_head_dim,
        v_dim=arch.v_dim,
        vocab=arch.vocab,
        attn_layers=attn,
        attn_params=arch.attn_params_per_layer,
        mamba_layers=sum(1 for m, _ in kinds if m == "mamba"),
        mamba_params=arch.mamba_params_per_layer if arch.is_hybrid else 0,
        dense_layers=sum(1 for _, f in kinds if f == "dense"),
        ffn=arch.ffn,
        gated=arch.gated_mlp,
        moe_layers=sum(1 for _, f in kinds if f == "moe"),
        experts=arch.experts,
        top_k=arch.top_k,
        expert_ffn=arch.moe_ffn if arch.is_moe else 0,
        shared_ffn=shared if arch.is_moe else 0,
        kv_latent=(arch.kv_lora_rank + arch.qk_rope_dim) if arch.is_mla else 0,
        window=arch.sliding_window,
        window_layers=min(arch.sliding_layers, attn) if arch.sliding_window else 0,
    )


@dataclass(frozen=True)
class Layout:
    """How `gpus` GPUs serve: `pp` pipeline stages; in each stage attention is split `tp` ways (so a stage holds
    gpus/pp/tp attention replicas), experts `ep` ways and each expert (gpus/pp)/ep ways."""

    gpus: int
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def stage_gpus(self) -> int:
        return self.gpus // self.pp

    @property
    def attn_dp(self) -> int:
        return self.stage_gpus // self.tp

    @property
    def etp(self) -> int:
        return self.stage_gpus // self.ep


def check_layout(s: ServeShape, lay: Layout) -> None:
    """Raise ServeError naming the flag when the layout cannot hold this model."""
    for flag, v in (("--gpus", lay.gpus), ("--tp", lay.tp), ("--pp", lay.pp), ("--ep", lay.ep)):
        if v < 1:
            raise ServeError(f"{flag} must be at least 1 (got {v})")
    if lay.gpus % lay.pp:
        raise ServeError(f"--gpus {lay.gpus} does not split into --pp {lay.pp} pipeline stages")
    if lay.stage_gpus % lay.tp:
        raise ServeError(f"--tp {lay.tp} does not divide the {lay.stage_gpus} GPUs of a pipeline stage (--gpus/--pp)")
    if lay.pp > s.layers:
        raise ServeError(f"--pp {lay.pp} is more than the model's {s.layers} layers")
    if s.heads % lay.tp:
        raise ServeError(f"--tp {lay.tp} does not divide the model's {s.heads} attention heads")
    if not s.is_moe and lay.ep != 1:
        raise ServeError(f"--ep applies to Mixture-of-Experts models; {s.name} is dense")
    if lay.stage_gpus % lay.ep:
        raise ServeError(f"--ep {lay.ep} does not divide the {lay.stage_gpus} GPUs of a pipeline stage")
    if s.is_moe and s.experts % lay.ep:
        raise ServeError(f"--ep {lay.ep} does not divide the model's {s.experts} experts")
    if lay.etp > 1 and s.is_moe and s.expert_ffn % lay.etp:
        raise ServeError(f"the expert FFN ({s.expert_ffn}) does not split over {lay.etp} GPUs (raise --ep)")


def _per_stage(count: int, lay: Layout) -> int:
    return math.ceil(count / lay.pp)


def weight_bytes_per_gpu(s: ServeShape, lay: Layout, precision: ServePrecision) -> float:
    """Weights on the busiest GPU: its stage's share of each layer kind, and the embedding or LM head (both when
    pp = 1). Experts spread over all the stage's GPUs, everything else over the TP group."""
    per_tp = _per_stage(s.attn_layers, lay) * s.attn_params + _per_stage(s.mamba_layers, lay) * s.mamba_params
    per_tp += _per_stage(s.dense_layers, lay) * s.mlp_mult * s.hidden * s.ffn
    moe = _per_stage(s.moe_layers, lay)
    per_tp += moe * (s.mlp_mult * s.hidden * s.shared_ffn + s.hidden * s.experts)
    per_gpu = per_tp / lay.tp + moe * s.experts * s.expert_params / lay.stage_gpus
    emb = s.vocab * s.hidden * (2 if lay.pp == 1 else 1) / lay.tp
    return per_gpu * WEIGHT_BYTES[precision] + emb * EMBEDDING_BYTES


def kv_bytes_per_token(s: ServeShape, lay: Layout, precision: ServePrecision, ctx: float = 0.0) -> float:
    """KV cache bytes one GPU holds per token of context (its stage's attention layers) for sequences `ctx`
    tokens long (windowed layers keep only their window)."""
    layers = s.kv_layers_at(ctx) if ctx else float(s.attn_layers)
    return layers / lay.pp * s.kv_elems_per_token_layer(lay.tp) * KV_BYTES[precision]


def check_precision(gpu: GPUSpec, precision: ServePrecision) -> None:
    if precision == "fp4" and gpu.arch != "blackwell":
        raise ServeError(f"--precision fp4 (NVFP4) needs a Blackwell GPU; {gpu.name} is {gpu.arch}")
    prec = MATMUL_PRECISION[precision]
    if not gpu.tflops.get(prec):
        known = ", ".join(p for p in SERVE_PRECISIONS if gpu.tflops.get(MATMUL_PRECISION[p]))
        raise ServeError(f"--precision {precision}: {gpu.name} has no {prec} tensor cores; supported: {known}")
