"""The bytes of a loaded model's weights that one decode step reads: the roofline's weight term.

The runner reports them (``executor.base.RunnerInfo``), so that ``attnserve bench`` can compute each row's
limit (``benchmarks/roofline.py``) from what the engine actually holds, on each rank.
"""

from __future__ import annotations

import torch


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one decode step reads: every parameter once (shared ones once), except an
    ``nn.Embedding`` table that is not shared with another module (the LM head): only B rows of it are read."""
    from attnserve.layers.embedding import ParallelLMHead, VocabParallelEmbedding

    def is_table(m: torch.nn.Module) -> bool:  # a lookup table, not an LM head
        return isinstance(m, (torch.nn.Embedding, VocabParallelEmbedding)) and not isinstance(m, ParallelLMHead)

    embedding_only = set()
    for m in model.modules():
        if is_table(m):
            embedding_only.add(id(m.weight))
    for m in model.modules():
        if not is_table(m):
            for p in m.parameters(recurse=False):
                embedding_only.discard(id(p))
    # a tied head reads the token table through F.linear(hidden, embed.weight): count the largest table then
    tied = bool(getattr(model, "tie_word_embeddings", False))
    tables = [p for p in model.parameters() if id(p) in embedding_only]
    if tied and tables:
        embedding_only.discard(id(max(tables, key=lambda p: p.numel())))
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or id(p) in embedding_only:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


def moe_expert_bytes(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(bytes, E, k)``: the bytes of every routed expert's weights (and biases) of every ``FusedMoE`` layer,
    and the first layer's expert count and experts per token; ``(0, 0, 0)`` for a dense model."""
    from attnserve.layers.moe import FusedMoE

    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    if not layers:
        return 0, 0, 0
    total = sum(p.numel() * p.element_size() for m in layers for p in m.parameters(recurse=False))
    return total, layers[0].num_experts, layers[0].top_k
