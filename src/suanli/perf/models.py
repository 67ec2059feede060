"""Dense transformer architectures and their FLOP and parameter counts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransformerArch:
    """A decoder-only transformer. `gated_mlp` is SwiGLU-style (three FFN matrices instead of two)."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    gated_mlp: bool = True
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def attn_params_per_layer(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return h * h + 2 * h * kv + h * h  # Q, K, V, O

    @property
    def mlp_params_per_layer(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.ffn

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden  # + two norms

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params + self.hidden

    # ---- FLOPs per token, training (forward + backward = 3x forward), no recomputation --------------
    def linear_flops_per_token(self) -> float:
        """Matmul FLOPs of all weight matrices incl. the output projection to the vocabulary."""
        per_layer = 2 * (self.attn_params_per_layer + self.mlp_params_per_layer)
        return 3.0 * (self.layers * per_layer + 2 * self.hidden * self.vocab)

    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Score (QK^T) and value (AV) products; a causal kernel skips the masked half."""
        full = 3.0 * self.layers * 4 * seq_len * self.hidden
        return full / 2 if causal else full

    def model_flops_per_token(self, seq_len: int) -> float:
        """The FLOPs MFU is quoted against (the Megatron/NeMo convention: full, non-causal attention).

        12·L·h²·(1 + kv/heads + s/h) + 6·L·h·ffn·(3 if gated else 2) + 6·V·h  per token.
        """
        return self.linear_flops_per_token() + self.attention_flops_per_token(seq_len, causal=False)


MODEL_PRESETS: dict[str, TransformerArch] = {
    m.name: m
    for m in (
        TransformerArch("llama3.1-8b", 32, 4096, 14336, 32, 8, 128256),
        TransformerArch("llama3.1-70b", 80, 8192, 28672, 64, 8, 128256),
        TransformerArch("llama3.1-405b", 126, 16384, 53248, 128, 8, 128256),
        TransformerArch("llama2-70b", 80, 8192, 28672, 64, 8, 32000),
        TransformerArch("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064),
        TransformerArch("gpt3-175b", 96, 12288, 49152, 96, 96, 50257, gated_mlp=False),
        TransformerArch("nemotron4-15b", 32, 6144, 24576, 48, 8, 256000, gated_mlp=False),
        TransformerArch("nemotron4-340b", 96, 18432, 73728, 96, 8, 256000, gated_mlp=False),
    )
}


def model_preset(name: str) -> TransformerArch:
    key = name.strip().lower()
    if key not in MODEL_PRESETS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(MODEL_PRESETS)} (or custom)")
    return MODEL_PRESETS[key]
