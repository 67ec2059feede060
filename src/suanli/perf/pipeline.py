"""How Megatron splits a model's layers over pipeline stages, and which of its options a split needs.

Megatron-LM builds `layers / (pp·vp)` layers per virtual stage and refuses a plan where that does not divide,
unless one of its options makes it: `account_for_embedding_in_pipeline_split` and
`account_for_loss_in_pipeline_split` count the embedding and the loss (output layer) as one layer each, so
`layers + 1` or `layers + 2` must divide; `decoder_first_pipeline_num_layers` /
`decoder_last_pipeline_num_layers` give the first and last stage fewer layers (vp = 1); and
`pipeline_model_parallel_layout` (e.g. DeepSeek-V3's "Et|(tt|)*30mL") places any number of layers, the
embedding and the loss on each virtual stage. Only more chunks than layers (+ embedding + loss) is impossible.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineSplit:
    """Layer counts of every virtual stage (chunk `c` runs on physical stage `c % pp`), and the option used."""

    chunks: tuple[int, ...]
    option: str  # "even", "account_for_loss", "account_for_embedding_and_loss", "first_last_stage", "layout"
    embedding_counted: bool = False
    loss_counted: bool = False

    def stage_layers(self, pp: int) -> list[int]:
        out = [0] * pp
        for c, n in enumerate(self.chunks):
            out[c % pp] += n
        return out

    def layer_ranges(self, pp: int) -> list[list[tuple[int, int]]]:
        """Per physical stage, the [start, end) ranges of model layers its chunks hold."""
        out: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
        start = 0
        for c, n in enumerate(self.chunks):
            out[c % pp].append((start, start + n))
            start += n
        return out


def _balanced(total: int, parts: int) -> list[int]:
    """`total` units over `parts`, the remainder to the middle parts (the first and last carry the embedding
    and the loss)."""
    base, extra = divmod(total, parts)
    sizes = [base] * parts
    order = sorted(range(parts), key=lambda i: (i in (0, parts - 1), abs(i - (parts - 1) / 2)))
    for i in order[:extra]:
        sizes[i] += 1
    return sizes


def split_layers(layers: int, pp: int, vp: int = 1) -> PipelineSplit:
    """Megatron's split of `layers` over `pp` stages of `vp` virtual chunks, with the least special option.

    Raises ValueError only where no Megatron option can run it (more chunks than layers + embedding + loss).
    """
    chunks = pp * vp
    if pp < 1 or vp < 1:
        raise ValueError("pp and vp must be at least 1")
    if pp == 1:
        return PipelineSplit((layers,), "even")
    if layers % chunks == 0:
        return PipelineSplit(tuple([layers // chunks] * chunks), "even")
    if (layers + 1) % chunks == 0:
        n = (layers + 1) // chunks
        return PipelineSplit(tuple([n] * (chunks - 1) + [n - 1]), "account_for_loss", loss_counted=True)
    if (layers + 2) % chunks == 0:
        n = (layers + 2) // chunks
        sizes = [n - 1] + [n] * (chunks - 2) + [n - 1]
        return PipelineSplit(tuple(sizes), "account_for_embedding_and_loss", True, True)
    if chunks > layers + 2:
        raise ValueError(
            f"{layers} layers cannot fill pp*vp = {chunks} pipeline chunks, even counting the embedding and the loss "
            "as layers (pipeline_model_parallel_layout); use a smaller --pp or --vp"
        )
    if vp == 1 and pp > 2:
        # decoder_first/last_pipeline_num_layers: the middle stages even, the first and last take the rest
        mid = -(-layers // pp)
        while mid > 0:
            rest = layers - mid * (pp - 2)
            if rest >= 0 and rest <= 2 * mid:
                first = rest // 2
                return PipelineSplit(tuple([first] + [mid] * (pp - 2) + [rest - first]), "first_last_stage")
            mid -= 1
    sizes = _balanced(layers + 2, chunks)  # pipeline_model_parallel_layout: embedding and loss as layers
    sizes[0] -= 1
    sizes[-1] -= 1
    return PipelineSplit(tuple(sizes), "layout", True, True)


OPTION_TEXT = {
    "even": "",
    "account_for_loss": "account_for_loss_in_pipeline_split",
    "account_for_embedding_and_loss": "account_for_embedding_in_pipeline_split + account_for_loss_in_pipeline_split",
    "first_last_stage": "decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers",
    "layout": "pipeline_model_parallel_layout",
}
