"""The Attention module that models call: routes q/k/v to the selected backend's Impl."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from attnserve.attention.backend import AttentionImpl

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.kernels.fused_ops import RopeInputs
    from attnserve.attention.forward_batch import ForwardBatch


class Attention(nn.Module):
    """Paged self-attention of one layer. The KV cache and metadata come with each step's ForwardBatch."""

    def __init__(self, impl: AttentionImpl, layer_index: int, group_index: int | None = None) -> None:
        """``group_index``: this layer's layer group when the model has several (the step's ``attn_metadata``
        is then a tuple, one entry per group); None: ``attn_metadata`` is this layer's backend's metadata."""
        super().__init__()
        self.impl = impl
        self.layer_index = layer_index
        self.group_index = group_index

    def _metadata(self, batch: "ForwardBatch"):
        return batch.attn_metadata if self.group_index is None else batch.attn_metadata[self.group_index]

    def forward(
        self,
        query: torch.Tensor,  # (T, Hq, D)
        key: torch.Tensor,  # (T, Hkv, D)
        value: torch.Tensor,  # (T, Hkv, D)
        batch: "ForwardBatch",
    ) -> torch.Tensor:  # (T, Hq, D)
        if self.impl.kv_scales_pending:  # calculate_kv_scales: from this first step, before its K/V are stored
            self.impl.calculate_kv_scales(query, key, value)
        return self.impl.forward(query, key, value, batch.kv_caches[self.layer_index], self._metadata(batch))

    def forward_with_rope(
        self,
        query: torch.Tensor,  # (T, Hq, D), last dim contiguous (views into the fused qkv output are fine)
        key: torch.Tensor,  # (T, Hkv, D)
        value: torch.Tensor,  # (T, Hkv, D)
        batch: "ForwardBatch",
        rope: "RopeInputs",  # positions, cos/sin tables, Qwen3's q/k norm weights
    ) -> torch.Tensor:  # (T, Hq, D)
        """RoPE on ``query`` and ``key`` (in place), then :meth:`forward`; in one kernel where the backend
        can (``impl.forward_with_rope``).

        When the backend says where its KV write goes (``impl.kv_write_target``), the rotation stores the
        rotated keys and the values there itself (one kernel on CUDA instead of RoPE, then the backend's
        ``reshape_and_cache``) and the backend skips its write. Same values in the cache and the output
        either way; on CPU the same PyTorch ops in the same order."""
        kv_cache, metadata = batch.kv_caches[self.layer_index], self._metadata(batch)
        if self.impl.kv_scales_pending:  # calculate_kv_scales: the scales of the rotated keys, then the plain path
            rope.apply(query, key)
            self.impl.calculate_kv_scales(query, key, value)
            return self.impl.forward(query, key, value, kv_cache, metadata)
        out = self.impl.forward_with_rope(query, key, value, kv_cache, metadata, rope)
        if out is not None:  # the backend's kernel did it all (TRITON_ATTN's decode steps)
            return out
        target = self.impl.kv_write_target(kv_cache, metadata)
        if target is None:
            rope.apply(query, key)
            return self.impl.forward(query, key, value, kv_cache, metadata)
        rope.apply_kv_write(query, key, value, target)
        return self.impl.forward(query, key, value, kv_cache, metadata, kv_written=True)
