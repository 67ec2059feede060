"""Model presets: dense, Mixture-of-Experts and hybrid architectures, each figure with its source.

"(read)" marks a figure read in the cited source; "(recalled)" one taken from the model's published
configuration from memory, not checked in a source here -- a hypothesis to verify. Parameter totals are
checked against the model cards in tests/test_training.py.
"""

from __future__ import annotations

from suanli.perf.models import TransformerArch

_DGXC = "https://github.com/NVIDIA/dgxc-benchmarking/blob/c5c765f2684f983e787eaada4073b63c8287caf6"
_DGXC2 = "https://github.com/NVIDIA/dgxc-benchmarking/blob/1b172ed8861a1d663a21ef844fb231e05f80f72c"
_MLM_GB200 = (
    "https://github.com/NVIDIA/Megatron-LM/blob/eb0783b6d35607ef1953eaca60b37b886b1a25d0/docs/discussions/"
    "deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md"
)
_HF = "https://huggingface.co"


def _src(**figures: str) -> tuple[tuple[str, str], ...]:
    return tuple(figures.items())


_DEEPSEEK_V3 = dict(
    layers=61, hidden=7168, ffn=18432, heads=128, kv_heads=128, vocab=129280,
    experts=256, top_k=8, moe_ffn=2048, shared_experts=1, dense_layers=3,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, mtp_layers=1,
    sources=_src(
        layers=f"{_DGXC}/deepseek_v3/README.md (read: 61 layers, 671B)",
        experts_top_k=f"{_MLM_GB200} (read: 256 experts with top-8; first three layers dense)",
        shared_experts_moe_ffn_hidden_ffn_vocab=f"{_HF}/deepseek-ai/DeepSeek-V3/blob/main/config.json (recalled)",
        mla_dims=f"{_HF}/deepseek-ai/DeepSeek-V3/blob/main/config.json (recalled: q_lora 1536, kv_lora 512, "
        "qk_nope 128, qk_rope 64, v 128)",
        mtp_layers=f"{_HF}/deepseek-ai/DeepSeek-V3/blob/main/config.json (recalled: num_nextn_predict_layers 1)",
    ),
)  # fmt: skip

_QWEN3_SRC = f"{_DGXC2}/qwen3/pretrain/README.md (read: total/active params, layers)"
_GPTOSS_SRC = f"{_DGXC2}/gpt-oss/pretrain/README.md (read: 36 layers of the 120B)"

_PRESETS = (
    # ---- dense (NeMo performance tables; architectures from the model cards) ----
    TransformerArch("llama3.1-8b", 32, 4096, 14336, 32, 8, 128256),
    TransformerArch("llama3.1-70b", 80, 8192, 28672, 64, 8, 128256),
    TransformerArch("llama3.1-405b", 126, 16384, 53248, 128, 8, 128256),
    TransformerArch(
        "llama3.3-70b",
        80,
        8192,
        28672,
        64,
        8,
        128256,
        sources=_src(
            all=f"{_HF}/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json (recalled: same shape as Llama 3.1 70B)"
        ),
    ),
    TransformerArch("llama2-70b", 80, 8192, 28672, 64, 8, 32000),
    TransformerArch("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064),
    TransformerArch("gpt3-175b", 96, 12288, 49152, 96, 96, 50257, gated_mlp=False),
    TransformerArch("nemotron4-15b", 32, 6144, 24576, 48, 8, 256000, gated_mlp=False),
    TransformerArch("nemotron4-340b", 96, 18432, 73728, 96, 8, 256000, gated_mlp=False),
    # ---- hybrid Mamba-Transformer ----
    TransformerArch(
        "nemotron-h-56b",
        118,
        8192,
        32768,
        64,
        8,
        131072,
        gated_mlp=False,
        mamba_layers=54,
        attention_layers=10,
        mamba_state=256,
        mamba_groups=8,
        mamba_head_dim=64,
        sources=_src(
            layers_hidden_ffn_heads=f"{_DGXC}/nemotronh/README.md (read: 118 layers = 54 Mamba + 54 MLP + 10 "
            "attention, hidden 8192, ffn 32768, 64 heads, 8 KV heads)",
            mamba_dims_vocab=f"{_HF}/nvidia/Nemotron-H-56B-Base-8K/blob/main/config.json (recalled: state 256, "
            "8 groups, head dim 64, expand 2, vocab 131072, squared-ReLU MLP)",
        ),
    ),
    # ---- Mixture of Experts ----
    TransformerArch("deepseek-v3", **_DEEPSEEK_V3),  # type: ignore[arg-type]
    TransformerArch("deepseek-r1", **_DEEPSEEK_V3),  # type: ignore[arg-type]  # same architecture (model card)
    TransformerArch(
        "kimi-k2",
        61,
        7168,
        18432,
        64,
        64,
        163840,
        experts=384,
        top_k=8,
        moe_ffn=2048,
        shared_experts=1,
        dense_layers=1,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_dim=128,
        qk_rope_dim=64,
        v_head_dim=128,
        sources=_src(
            experts_top_k_params="moe_and_inference.yaml model_architecture_facts (recalled: 1T total, 32B active, "
            "384 experts, top-8)",
            all_dims=f"{_HF}/moonshotai/Kimi-K2-Base/blob/main/config.json (recalled: DeepSeek-V3 layout with 64 "
            "heads, 384 experts, 1 dense layer, vocab 163840, no MTP)",
        ),
    ),
    TransformerArch(
        "qwen3-235b-a22b",
        94,
        4096,
        12288,
        64,
        4,
        151936,
        attn_head_dim=128,
        experts=128,
        top_k=8,
        moe_ffn=1536,
        sources=_src(
            layers_params=_QWEN3_SRC,
            dims=f"{_HF}/Qwen/Qwen3-235B-A22B/blob/main/config.json (recalled: hidden 4096, 64 heads, 4 KV heads, "
            "head dim 128, 128 experts top-8, expert ffn 1536, vocab 151936)",
        ),
    ),
    TransformerArch(
        "qwen3-30b-a3b",
        48,
        2048,
        6144,
        32,
        4,
        151936,
        attn_head_dim=128,
        experts=128,
        top_k=8,
        moe_ffn=768,
        sources=_src(
            layers_params=_QWEN3_SRC,
            dims=f"{_HF}/Qwen/Qwen3-30B-A3B/blob/main/config.json (recalled: hidden 2048, 32 heads, 4 KV heads, "
            "head dim 128, 128 experts top-8, expert ffn 768, vocab 151936)",
        ),
    ),
    TransformerArch(
        "mixtral-8x7b",
        32,
        4096,
        14336,
        32,
        8,
        32000,
        experts=8,
        top_k=2,
        moe_ffn=14336,
        sources=_src(
            all=f"{_HF}/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json (recalled; 46.7B total, "
            "12.9B active per moe_and_inference.yaml, recalled)"
        ),
    ),
    TransformerArch(
        "mixtral-8x22b",
        56,
        6144,
        16384,
        48,
        8,
        32768,
        experts=8,
        top_k=2,
        moe_ffn=16384,
        sources=_src(
            all=f"{_HF}/mistralai/Mixtral-8x22B-v0.1/blob/main/config.json (recalled; 141B total, 39B active)"
        ),
    ),
    TransformerArch(
        "gpt-oss-120b",
        36,
        2880,
        2880,
        64,
        8,
        201088,
        attn_head_dim=64,
        experts=128,
        top_k=4,
        moe_ffn=2880,
        sliding_window=128,
        sliding_layers=18,
        sources=_src(
            layers=_GPTOSS_SRC,
            dims=f"{_HF}/openai/gpt-oss-120b/blob/main/config.json (recalled: hidden 2880, 64 heads of 64, 8 KV "
            "heads, 128 experts top-4 of 2880, alternating 128-token sliding window, vocab 201088)",
        ),
    ),
    TransformerArch(
        "gpt-oss-20b",
        24,
        2880,
        2880,
        64,
        8,
        201088,
        attn_head_dim=64,
        experts=32,
        top_k=4,
        moe_ffn=2880,
        sliding_window=128,
        sliding_layers=12,
        sources=_src(all=f"{_HF}/openai/gpt-oss-20b/blob/main/config.json (recalled: 24 layers, 32 experts top-4)"),
    ),
    TransformerArch(
        "llama4-maverick",
        48,
        5120,
        16384,
        40,
        8,
        202048,
        attn_head_dim=128,
        experts=128,
        top_k=1,
        moe_ffn=8192,
        shared_experts=1,
        moe_every=2,
        sources=_src(
            layers_hidden_ffn_heads_experts_vocab=f"{_DGXC}/llama4/README.md (read: 48 layers, hidden 5120, ffn "
            "16384, 128 experts top-1, 40 heads, 8 query groups, vocab 202048)",
            moe_ffn_shared_interleave=f"{_HF}/meta-llama/Llama-4-Maverick-17B-128E/blob/main/config.json "
            "(recalled: expert ffn 8192, one shared expert, MoE on every other layer)",
        ),
    ),
    TransformerArch(
        "llama4-scout",
        48,
        5120,
        16384,
        40,
        8,
        202048,
        attn_head_dim=128,
        experts=16,
        top_k=1,
        moe_ffn=8192,
        shared_experts=1,
        sources=_src(
            all=f"{_HF}/meta-llama/Llama-4-Scout-17B-16E/blob/main/config.json (recalled: 16 experts "
            "top-1 + 1 shared of 8192 on every layer; 109B total, 17B active)"
        ),
    ),
    TransformerArch(
        "grok-1",
        64,
        6144,
        32768,
        48,
        8,
        131072,
        experts=8,
        top_k=2,
        moe_ffn=32768,
        sources=_src(
            layers_hidden_ffn_top_k_heads=f"{_DGXC}/grok1/README.md (read: 64 layers, hidden 6144, ffn 32768, "
            "top-2, 48 heads, 8 query groups; its flops note uses vocab 128256)",
            experts_vocab="https://github.com/xai-org/grok-1/blob/main/run.py (recalled: 8 experts, vocab 131072)",
        ),
    ),
)

MODEL_PRESETS: dict[str, TransformerArch] = {m.name: m for m in _PRESETS}
