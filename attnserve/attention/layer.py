"""The Attention module that models call: routes q/k/v to the selected backend's Impl."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from attnserve.attention.backend import AttentionImpl

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.model_executor.forward_batch import ForwardBatch


class Attention(nn.Module):
    """Paged self-attention of one layer. The KV cache and metadata come with each step's ForwardBatch."""

    def __init__(self, impl: AttentionImpl, layer_index: int) -> None:
        super().__init__()
        self.impl = impl
        self.layer_index = layer_index

    def forward(
        self,
        query: torch.Tensor,  # (T, Hq, D)
        key: torch.Tensor,  # (T, Hkv, D)
        value: torch.Tensor,  # (T, Hkv, D)
        batch: "ForwardBatch",
    ) -> torch.Tensor:  # (T, Hq, D)
        return self.impl.forward(query, key, value, batch.kv_caches[self.layer_index], batch.attn_metadata)
