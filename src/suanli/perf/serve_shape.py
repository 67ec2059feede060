"""What LLM serving needs to know of an architecture and a parallel layout: weights per GPU, KV cache per token.

A `ServeShape` is derived from a `TransformerArch` (dense, or with the Mixture-of-Experts and MLA fields when the
architecture has them) and is what `perf.inference` costs. Pure.
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
    """Per-layer sizes a forward pass touches. MoE fields are zero for a dense model."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    attn_params: int  # per layer
    mlp_params: int  # dense MLP per layer (or the shared experts of an MoE layer)
    ffn: int  # dense FFN inner size
    gated: bool
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    moe_layers: int = 0  # layers with routed experts (the rest are dense)
    kv_latent: int = 0  # MLA: compressed KV (+ decoupled RoPE key) per token per layer, shared by all heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def expert_params(self) -> int:
        return (3 if self.gated else 2) * self.hidden * self.expert_ffn

    def kv_elems_per_token_layer(self, tp: int) -> float:
        """KV cache entries one GPU keeps per token and layer: each TP rank keeps at least one KV head; MLA's
        latent is not split by heads, so every rank keeps all of it."""
        if self.kv_latent:
            return float(self.kv_latent)
        return 2.0 * math.ceil(self.kv_heads / tp) * self.head_dim

    def total_params(self) -> float:
        dense_layers = self.layers - self.moe_layers
        per_dense = self.attn_params + (3 if self.gated else 2) * self.hidden * self.ffn
        per_moe = self.attn_params + self.mlp_params + self.experts * self.expert_params
        return dense_layers * per_dense + self.moe_layers * per_moe + 2 * self.vocab * self.hidden


def shape_of(arch: TransformerArch) -> ServeShape:
    """The serving view of an architecture; reads the MoE/MLA fields where the architecture has them."""
    experts = int(getattr(arch, "experts", 0) or 0)
    top_k = int(getattr(arch, "top_k", 0) or 0)
    moe_ffn = int(getattr(arch, "moe_ffn", 0) or 0) or arch.ffn
    shared = int(getattr(arch, "shared_experts", 0) or 0)
    dense_layers = int(getattr(arch, "dense_layers", 0) or 0)
    kv_lora = int(getattr(arch, "kv_lora_rank", 0) or 0)
    rope = int(getattr(arch, "qk_rope_dim", 0) or getattr(arch, "qk_rope_head_dim", 0) or 0)
    gated = arch.gated_mlp
    mlp = shared * (3 if gated else 2) * arch.hidden * moe_ffn if experts else arch.mlp_params_per_layer
    return ServeShape(
        name=arch.name,
        layers=arch.layers,
        hidden=arch.hidden,
        heads=arch.heads,
        kv_heads=arch.kv_heads,
        head_dim=arch.head_dim,
        vocab=arch.vocab,
        attn_params=arch.attn_params_per_layer,
        mlp_params=mlp,
        ffn=arch.ffn,
        gated=gated,
        experts=experts,
        top_k=top_k if experts else 0,
        expert_ffn=moe_ffn if experts else 0,
        moe_layers=(arch.layers - dense_layers) if experts else 0,
        kv_latent=(kv_lora + rope) if kv_lora else 0,
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


def weight_bytes_per_gpu(s: ServeShape, lay: Layout, precision: ServePrecision) -> float:
    """Weights on the busiest GPU: its stage's layers, and the embedding or LM head (both when pp = 1)."""
    wb = WEIGHT_BYTES[precision]
    moe_per_stage = math.ceil(s.moe_layers / lay.pp)
    dense_per_stage = math.ceil((s.layers - s.moe_layers) / lay.pp)
    dense_mlp = (3 if s.gated else 2) * s.hidden * s.ffn
    per_gpu = dense_per_stage * (s.attn_params + dense_mlp) / lay.tp
    per_gpu += moe_per_stage * (s.attn_params + s.mlp_params) / lay.tp
    per_gpu += moe_per_stage * s.experts * s.expert_params / lay.stage_gpus
    emb = s.vocab * s.hidden * (2 if lay.pp == 1 else 1) / lay.tp
    return per_gpu * wb + emb * EMBEDDING_BYTES


def kv_bytes_per_token(s: ServeShape, lay: Layout, precision: ServePrecision) -> float:
    """KV cache bytes one GPU holds per token of context (its stage's layers)."""
    return math.ceil(s.layers / lay.pp) * s.kv_elems_per_token_layer(lay.tp) * KV_BYTES[precision]


def check_precision(gpu: GPUSpec, precision: ServePrecision) -> None:
    if precision == "fp4" and gpu.arch != "blackwell":
        raise ServeError(f"--precision fp4 (NVFP4) needs a Blackwell GPU; {gpu.name} is {gpu.arch}")
    prec = MATMUL_PRECISION[precision]
    if not gpu.tflops.get(prec):
        known = ", ".join(p for p in SERVE_PRECISIONS if gpu.tflops.get(MATMUL_PRECISION[p]))
        raise ServeError(f"--precision {precision}: {gpu.name} has no {prec} tensor cores; supported: {known}")
