"""Transformer architectures (dense, Mixture-of-Experts, MLA, hybrid Mamba) and their FLOP and parameter counts.

One record describes every model the performance model knows. Fields beyond the dense core default to "not
used" (0), so a dense transformer is written exactly as before. Layers are typed (`layer_kinds`): an attention
mixer (GQA or MLA) or a Mamba-2 mixer, and a dense MLP, an MoE block or none; per-layer costs and the pipeline
split follow those kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Mixer = Literal["attn", "mamba", "none"]
Ffn = Literal["dense", "moe", "none"]


@dataclass(frozen=True)
class TransformerArch:
    """A decoder-only model. `gated_mlp` is SwiGLU-style (three FFN matrices instead of two).

    MoE: `experts` routed experts of inner size `moe_ffn`, `top_k` per token, `shared_experts` always-on
    experts of `shared_ffn` (default `moe_ffn`); the first `dense_layers` layers and, with `moe_every` = k,
    all but every k-th later layer use the dense `ffn`. MLA (DeepSeek): `kv_lora_rank` > 0 turns it on.
    Hybrid (Nemotron-H): `mamba_layers` Mamba-2 layers and `attention_layers` attention layers without MLP;
    the remaining layers are MLP-only. `mtp_layers`: multi-token-prediction modules (one extra block each).
    """

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    gated_mlp: bool = True
    tied_embeddings: bool = False
    attn_head_dim: int = 0  # 0: hidden / heads (Qwen3 uses 128 with hidden 4096 and 64 heads)
    # ---- Mixture of Experts ----
    experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    shared_experts: int = 0
    shared_ffn: int = 0
    dense_layers: int = 0
    moe_every: int = 1
    # ---- Multi-head latent attention ----
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    # ---- multi-token prediction, windowed attention ----
    mtp_layers: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0  # how many attention layers use the window (GPT-OSS: every other one)
    # ---- hybrid Mamba-2 ----
    mamba_layers: int = 0
    attention_layers: int = 0
    mamba_state: int = 128
    mamba_groups: int = 8
    mamba_head_dim: int = 64
    mamba_expand: int = 2
    # figure → where it comes from ("URL (read)" / "(recalled)"); not part of the architecture's identity
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("experts", "top_k", "moe_ffn", "shared_experts", "shared_ffn", "dense_layers", "q_lora_rank",
                     "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim", "mtp_layers", "sliding_window",
                     "sliding_layers", "mamba_layers", "attention_layers", "attn_head_dim"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.moe_every < 1:
            raise ValueError("moe_every must be >= 1")
        if not self.attn_head_dim and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise ValueError(f"top_k must be between 1 and experts ({self.experts})")
            if self.moe_ffn <= 0:
                raise ValueError("an MoE model needs moe_ffn > 0")
        elif self.top_k or self.shared_experts:
            raise ValueError("top_k and shared_experts need experts > 0")
        if self.kv_lora_rank and (self.qk_nope_dim + self.qk_rope_dim <= 0 or self.v_head_dim <= 0):
            raise ValueError("MLA needs qk_nope_dim + qk_rope_dim > 0 and v_head_dim > 0")
        if self.dense_layers > self.layers:
            raise ValueError("dense_layers cannot exceed layers")
        if self.mamba_layers + self.attention_layers > self.layers:
            raise ValueError("mamba_layers + attention_layers cannot exceed layers")

    # ---- shape helpers ------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_hybrid(self) -> bool:
        return self.mamba_layers > 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim if self.is_mla else self.head_dim

    @property
    def v_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def _mlp_mult(self) -> int:
        return 3 if self.gated_mlp else 2

    def layer_kinds(self) -> tuple[tuple[Mixer, Ffn], ...]:
        """(mixer, ffn) of every layer in order. Hybrid layers interleave evenly (Mamba, MLP, … attention)."""
        if self.is_hybrid:
            n_mlp = self.layers - self.mamba_layers - self.attention_layers
            kinds: list[tuple[Mixer, Ffn]] = []
            counts = {"mamba": self.mamba_layers, "mlp": n_mlp, "attn": self.attention_layers}
            done = dict.fromkeys(counts, 0)
            for i in range(self.layers):
                # pick the kind furthest behind its even share at this depth
                kind = max(counts, key=lambda k: (counts[k] * (i + 1) / self.layers - done[k], k == "mamba"))
                done[kind] += 1
                ffn: Ffn = "moe" if self.is_moe else "dense"
                kinds.append({"mamba": ("mamba", "none"), "attn": ("attn", "none"), "mlp": ("none", ffn)}[kind])  # type: ignore[arg-type]
            return tuple(kinds)
        out: list[tuple[Mixer, Ffn]] = []
        for i in range(self.layers):
            moe = (
                self.is_moe
                and i >= self.dense_layers
                and (i - self.dense_layers) % self.moe_every == self.moe_every - 1
            )
            out.append(("attn", "moe" if moe else "dense"))
        return tuple(out)

    # ---- parameters ----------------------------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden
        if self.is_mla:
            q_out = self.heads * self.qk_head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * q_out if self.q_lora_rank else h * q_out
            kv = h * (self.kv_lora_rank + self.qk_rope_dim) + self.kv_lora_rank * self.heads * (
                self.qk_nope_dim + self.v_head_dim
            )
            return q + kv + self.heads * self.v_head_dim * h
        hd = self.head_dim
        return 2 * h * self.heads * hd + 2 * h * self.kv_heads * hd  # Q, O, K, V

    @property
    def mamba_params_per_layer(self) -> int:
        h, di = self.hidden, self.mamba_expand * self.hidden
        gn = self.mamba_groups * self.mamba_state
        nh = di // self.mamba_head_dim
        return h * (2 * di + 2 * gn + nh) + 4 * (di + 2 * gn) + di * h + 3 * nh

    @property
    def dense_mlp_params(self) -> int:
        return self._mlp_mult * self.hidden * self.ffn

    @property
    def expert_params(self) -> int:
        """One routed expert's weights."""
        return self._mlp_mult * self.hidden * self.moe_ffn

    @property
    def shared_expert_params(self) -> int:
        return self.shared_experts * self._mlp_mult * self.hidden * (self.shared_ffn or self.moe_ffn)

    @property
    def mlp_params_per_layer(self) -> int:
        """Dense MLP parameters of one layer (kept for dense callers; MoE layers: see `moe_params_per_layer`)."""
        return self.dense_mlp_params

    @property
    def moe_params_per_layer(self) -> int:
        return self.experts * self.expert_params + self.shared_expert_params + self.hidden * self.experts

    def _layer_params(self, mixer: Mixer, ffn: Ffn, active: bool = False) -> int:
        p = 2 * self.hidden  # norms
        p += {"attn": self.attn_params_per_layer, "mamba": self.mamba_params_per_layer, "none": 0}[mixer]
        if ffn == "dense":
            p += self.dense_mlp_params
        elif ffn == "moe":
            routed = (self.top_k if active else self.experts) * self.expert_params
            p += routed + self.shared_expert_params + self.hidden * self.experts
        return p

    @property
    def layer_params_total(self) -> int:
        return sum(self._layer_params(m, f) for m, f in self.layer_kinds())

    @property
    def params_per_layer(self) -> int:
        """Average parameters per layer (all experts counted)."""
        return self.layer_params_total // self.layers

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def mtp_params(self) -> int:
        """Each MTP module: a projection of [h; embedding] → h, two norms and one MoE (or dense) block."""
        block = self._layer_params("attn", "moe" if self.is_moe else "dense")
        return self.mtp_layers * (2 * self.hidden * self.hidden + 3 * self.hidden + block)

    @property
    def params(self) -> int:
        """Total parameters of the main model (MTP modules excluded, as model cards count them)."""
        return self.layer_params_total + self.embedding_params + self.hidden

    @property
    def active_params(self) -> int:
        """Parameters one token uses: routed experts counted top_k times."""
        return sum(self._layer_params(m, f, active=True) for m, f in self.layer_kinds()) + self.embedding_params

    # ---- FLOPs per token, training (forward + backward = 3x forward), no recomputation --------------
    def _mixer_matmul_params(self, mixer: Mixer) -> int:
        return {"attn": self.attn_params_per_layer, "mamba": self.mamba_params_per_layer, "none": 0}[mixer]

    def _ffn_matmul_params(self, ffn: Ffn) -> int:
        if ffn == "dense":
            return self.dense_mlp_params
        if ffn == "moe":
            return self.top_k * self.expert_params + self.shared_expert_params + self.hidden * self.experts
        return 0

    def linear_flops_per_token(self) -> float:
        """Matmul FLOPs of all weights a token uses, incl. the output projection and MTP modules."""
        per = sum(self._mixer_matmul_params(m) + self._ffn_matmul_params(f) for m, f in self.layer_kinds())
        mtp_block = self._mixer_matmul_params("attn") + self._ffn_matmul_params("moe" if self.is_moe else "dense")
        mtp = self.mtp_layers * (mtp_block + 2 * self.hidden * self.hidden + self.hidden * self.vocab)
        return 6.0 * (per + self.hidden * self.vocab + mtp)

    @property
    def attention_layer_count(self) -> int:
        return sum(1 for m, _ in self.layer_kinds() if m == "attn") + self.mtp_layers

    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Score (QK^T) and value (AV) products; a causal kernel skips the masked half; windowed layers see
        at most `sliding_window` keys."""
        per_key = 3.0 * 2 * self.heads * (self.qk_head_dim + self.v_dim)  # fwd+bwd FLOPs per (query, key)
        n_attn = self.attention_layer_count
        n_win = min(self.sliding_layers, n_attn) if self.sliding_window else 0
        full = per_key * seq_len * (n_attn - n_win)
        full = full / 2 if causal else full
        win = per_key * n_win * (min(self.sliding_window, seq_len) if causal else min(2 * self.sliding_window, seq_len))
        mamba = 3.0 * 4 * self.mamba_expand * self.hidden * self.mamba_state * self.mamba_layers  # SSD scan
        return full + win + mamba

    def model_flops_per_token(self, seq_len: int) -> float:
        """The FLOPs MFU is quoted against (the Megatron/NeMo convention: full, non-causal attention).

        Dense: 12·L·h²·(1 + kv/heads + s/h) + 6·L·h·ffn·(3 if gated else 2) + 6·V·h  per token; MoE
        counts the top-k routed and the shared experts a token passes through.
        """
        return self.linear_flops_per_token() + self.attention_flops_per_token(seq_len, causal=False)


def model_preset(name: str) -> TransformerArch:
    from suanli.perf.presets import MODEL_PRESETS

    key = name.strip().lower()
    if key not in MODEL_PRESETS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(MODEL_PRESETS)} (or custom)")
    return MODEL_PRESETS[key]
