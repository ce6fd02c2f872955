"""Token embedding and LM head split over tensor-parallel ranks by vocabulary rows (vLLM ``vocab_parallel_embedding.py``).

Each rank holds rows ``[start, end)`` of the vocabulary, padded to ``ceil(vocab / size)`` rows. The embedding
looks up only the ids it holds (others give zeros) and all-reduces; the LM head computes its rows' logits and
all-gathers them. With ``tp.size == 1`` both are exactly ``F.embedding`` / ``hidden @ weight.t()``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.distributed.sharding import shard_vocab
from attnserve.layers.linear import check_shape, gemv_or_linear


class VocabParallelEmbedding(nn.Module):
    """Embedding table ``(vocab, dim)``; this rank's rows in ``weight`` ``(ceil(vocab / size), dim)``."""

    gemv: tuple | None = None  # for logits(), set once by GemvPlan.apply (as ColumnParallelLinear.gemv)
    greedy: tuple | None = None  # for greedy_tokens(): row count -> fused greedy head or None (GemvPlan.apply)

    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.num_embeddings = num_embeddings
        self.shard = shard_vocab(num_embeddings, tp.size, tp.rank)
        self.weight = nn.Parameter(torch.empty(self.shard.rows, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (T,) int64 -> (T, dim)
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        s = self.shard
        mine = (input_ids >= s.start) & (input_ids < s.end)
        out = F.embedding(torch.where(mine, input_ids - s.start, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill(~mine.unsqueeze(-1), 0))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, dim) -> (N, vocab) model dtype, on every rank
        local = hidden @ self.weight.t() if self.gemv is None else gemv_or_linear(self.gemv, hidden, self.weight, None)
        if self.tp.size > 1:
            local = self.tp.all_gather(local)[:, : self.num_embeddings]
        return local

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:  # (N, dim) -> (N,) int64, or None
        """``logits(hidden).argmax(-1)`` without the logits (``triton_greedy_head``) where the GEMV plan measured
        that faster for N rows; None otherwise (no plan entry for N, or tensor parallelism: the caller then
        takes :meth:`logits` and an argmax)."""
        table = self.greedy
        if table is None or self.tp.size > 1 or hidden.shape[0] >= len(table) or table[hidden.shape[0]] is None:
            return None
        return table[hidden.shape[0]](hidden, self.weight)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int | None = None) -> None:
        check_shape(loaded, (self.num_embeddings, param.shape[1]))
        s = self.shard
        param.data[: s.end - s.start].copy_(loaded.narrow(0, s.start, s.end - s.start)[...])
        param.data[s.end - s.start:].zero_()  # padding rows: logits 0, cut off after the gather


class ParallelLMHead(VocabParallelEmbedding):
    """An untied LM head: ``forward(hidden)`` gives the full vocabulary's logits (tied heads call the
    embedding's ``logits``)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, dim) -> (N, vocab) float32
        return self.logits(hidden)
