"""CPU_ATTN: paged attention on the CPU with PyTorch's scaled_dot_product_attention.

Per step the builder turns the block table into, per request, the index of each cached token and the
attention mask; every layer then gathers its keys/values with one ``index_select`` and runs SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnserve.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    CudaGraphSupport,
)
from attnserve.attention.ops.kv_write import write_kv_cache
from attnserve.attention.ops.reference import causal_mask


@dataclass
class CPUAttentionRequest:
    """One request's view of the cache for this step."""

    query_start: int
    query_end: int
    token_slots: torch.Tensor  # (seq_len,) int64 flat cache slots of positions 0..seq_len-1
    mask: torch.Tensor | None  # (G * q_len, seq_len) bool, rows grouped as in CPUAttentionImpl; None = all visible


@dataclass
class CPUAttentionMetadata:
    """CPU_ATTN's per-step arguments."""

    slot_mapping: torch.Tensor  # (T,) int64
    requests: list[CPUAttentionRequest]


class CPUAttentionMetadataBuilder(AttentionMetadataBuilder):
    """Computes each request's token slots and mask once per step (shared by all layers)."""

    def build(self, common: CommonAttentionMetadata) -> CPUAttentionMetadata:
        bs = common.block_size
        qsl = common.query_start_loc_cpu.tolist()
        seq_lens = common.seq_lens_cpu.tolist()
        block_table = common.block_table.cpu()
        window = self.layer_spec.sliding_window
        group = self.layer_spec.num_heads // self.layer_spec.num_kv_heads
        requests = []
        for i, seq_len in enumerate(seq_lens):
            q_len = qsl[i + 1] - qsl[i]
            positions = torch.arange(seq_len)
            slots = block_table[i, positions // bs].long() * bs + positions % bs
            mask = None
            if q_len > 1 or (window is not None and seq_len > window):
                mask = causal_mask(q_len, seq_len, window).repeat(group, 1)
            requests.append(CPUAttentionRequest(qsl[i], qsl[i + 1], slots, mask))
        return CPUAttentionMetadata(slot_mapping=common.slot_mapping, requests=requests)


class CPUAttentionImpl(AttentionImpl):
    """Gathers each request's K/V from the paged cache and calls SDPA once per request.

    GQA without copying K/V: the G query heads that share a KV head are stacked along the query axis,
    ``(Hkv, G * q_len, D)``, so SDPA's batch is the KV heads. (SDPA's own ``enable_gqa`` takes ~35 ms per
    call on CPU in torch 2.13, 100x slower than this.)
    """

    def forward(self, query, key, value, kv_cache, metadata: CPUAttentionMetadata) -> torch.Tensor:
        write_kv_cache(key, value, kv_cache, metadata.slot_mapping)
        out = torch.empty_like(query)
        k_flat = kv_cache[0].reshape(-1, self.num_kv_heads, self.head_size)
        v_flat = kv_cache[1].reshape(-1, self.num_kv_heads, self.head_size)
        hkv, d = self.num_kv_heads, self.head_size
        for r in metadata.requests:
            q_len = r.query_end - r.query_start
            # (q_len, Hq, D) -> (Hq, q_len, D) -> (Hkv, G * q_len, D): head h uses KV head h // G
            q = query[r.query_start : r.query_end].transpose(0, 1).reshape(hkv, -1, d)
            k = k_flat.index_select(0, r.token_slots).transpose(0, 1).to(q.dtype)  # (Hkv, seq_len, D)
            v = v_flat.index_select(0, r.token_slots).transpose(0, 1).to(q.dtype)
            o = _attend(q, k, v, r.mask, self.scale)
            out[r.query_start : r.query_end] = o.reshape(self.num_heads, q_len, d).transpose(0, 1)
        return out


# below this many attention scores per request, explicit matmuls beat SDPA's CPU kernel, whose fixed cost
# (~0.2-2 ms per call in torch 2.13) dominates decode; above it SDPA avoids materializing the scores
_SMALL_SCORES = 1 << 22


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v for q (B, M, D), k/v (B, N, D), mask (M, N) bool or None."""
    if q.shape[0] * q.shape[1] * k.shape[1] > _SMALL_SCORES:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = torch.bmm(q, k.transpose(1, 2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.bmm(scores.softmax(dim=-1), v)


class CPUAttentionBackend(AttentionBackend):
    """Paged attention on the CPU through PyTorch SDPA; any head size and block size."""

    name = "CPU_ATTN"
    device_types = ("cpu",)
    supported_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes = ("auto",)
    supported_head_sizes = None
    supported_block_sizes = None
    supports_sliding_window = True
    cuda_graph_support = CudaGraphSupport.NEVER

    @staticmethod
    def get_impl_cls() -> type[CPUAttentionImpl]:
        return CPUAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[CPUAttentionMetadataBuilder]:
        return CPUAttentionMetadataBuilder
