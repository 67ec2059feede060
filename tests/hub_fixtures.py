"""A tiny causal language model and a tiny dataset, made by the test itself: nothing is downloaded.

The model is a two-layer Llama with random weights and a word-level tokenizer built locally; the dataset is two
rows written as Parquet by `datasets`. transformers, datasets and torch are in the dev extras; a test that needs
them skips, saying which package is missing, only where they are not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

WORDS = ["hello", "world", "the", "a", "of", "to", "and", "in", "is", "it"]


def need(*packages: str) -> None:
    for name in packages:
        pytest.importorskip(name, reason=f"{name} is not installed (it is in the dev extras: pip install -e '.[dev]')")


def make_model(out: Path, layers: int = 2, hidden: int = 32) -> Path:
    need("torch", "transformers", "tokenizers")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=64)  # fmt: skip
    model = LlamaForCausalLM(config)
    # random weights pick <unk>, <s> or </s> often (20 of 120 tokens in a trial), and those decode to no text or end the
    # answer: a test that counts streamed words would pass or fail by chance, so the model never generates them
    model.generation_config.suppress_tokens = [0, 1, 2]
    model.save_pretrained(out)
    fast.save_pretrained(out)
    (out / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny-llama\nRandom weights, for tests.\n")
    return out


def make_dataset(out: Path) -> Path:
    need("datasets")
    import datasets

    (out / "data").mkdir(parents=True)
    datasets.Dataset.from_dict({"text": ["hello world", "the a of", "it is"], "label": [0, 1, 0]}).to_parquet(
        str(out / "data" / "train-00000-of-00001.parquet")
    )
    (out / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n# tiny-ds\n")
    return out
