"""Token embedding and LM head split over tensor-parallel ranks by vocabulary rows (vLLM ``vocab_parallel_embedding.py``).

Each rank holds rows ``[start, end)`` of the vocabulary, padded to ``ceil(vocab / size)`` rows. The embedding
looks up only the ids it holds (others give zeros) and all-reduces; the LM head computes its rows' logits and
all-gathers them. With ``tp.size == 1`` both are exactly ``F.embedding`` / ``hidden @ weight.t()``. The logits'
product goes through one method object, ``quant_method`` (vLLM's ``UnquantizedEmbeddingMethod``), which the
GEMV plan (``attnserve/gemv``) may replace.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.distributed.group import SINGLE, TPGroup
from attnserve.distributed.sharding import shard_vocab
from attnserve.layers.linear import UnquantizedLinearMethod, check_shape


class UnquantizedEmbeddingMethod(UnquantizedLinearMethod):
    """The LM head's product ``hidden @ weight.t()`` (+ bias)."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = x @ layer.weight.t()
        return y if bias is None else y + bias


class VocabParallelEmbedding(nn.Module):
    """Embedding table ``(vocab, dim)``; this rank's rows in ``weight`` ``(ceil(vocab / size), dim)``."""

    # for logits(); the GEMV plan may set another (attnserve/gemv)
    quant_method: UnquantizedLinearMethod = UnquantizedEmbeddingMethod()

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
        local = self.quant_method.apply(self, hidden, None)
        if self.tp.size > 1:
            local = self.tp.all_gather(local)[:, : self.num_embeddings]
        return local

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: int | None = None) -> None:
        check_shape(loaded, (self.num_embeddings, param.shape[1]))
        s = self.shard
        param.data[: s.end - s.start].copy_(loaded.narrow(0, s.start, s.end - s.start)[...])
        param.data[s.end - s.start :].zero_()  # padding rows: logits 0, cut off after the gather


class ParallelLMHead(VocabParallelEmbedding):
    """An untied LM head: ``forward(hidden)`` gives the full vocabulary's logits (tied heads call the
    embedding's ``logits``)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, dim) -> (N, vocab) float32
        return self.logits(hidden)
