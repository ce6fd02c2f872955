"""CPU_ATTN: paged attention on the CPU in plain PyTorch ops.

Per step the builder turns the block tables into flat cache slots and masks once; every layer then
gathers its keys/values with ``index_select`` and attends. All decodes of a step (query length 1) run as
one padded batch; each prefill (or prefill chunk) runs on its own, so decodes and prefills always take separate
calls (``use_prefill_decode_attention`` is refused: it would change nothing).

fp8 KV cache (e4m3 or e5m2): the write stores ``x / scale`` saturated to the format's range (``write_kv``); the
gathered keys/values are dequantized on read (``to(model dtype) * scale``) before the matmuls.
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
from attnserve.kernels.kv_write import FP8_DTYPES, KVWriteTarget, kv_views
from attnserve.kernels.reference import causal_mask, softmax_with_sinks
from attnserve.refusals import Reason
from attnserve.refusals.backends import separate_calls


@dataclass
class CPUPrefill:
    """One prefill request's view of the cache for this step."""

    query_start: int
    query_end: int
    token_slots: torch.Tensor  # (seq_len,) int64 flat cache slots of positions 0..seq_len-1
    mask: torch.Tensor | None  # (G * q_len, seq_len) bool, rows grouped as in CPUAttentionImpl; None = all visible


@dataclass
class CPUAttentionMetadata:
    """CPU_ATTN's per-step arguments. Decodes are query rows 0..num_decodes-1."""

    slot_mapping: torch.Tensor  # (T,) int64
    num_decodes: int
    decode_slots: torch.Tensor  # (num_decodes, max_decode_len) int64, padded with slot 0
    decode_mask: torch.Tensor  # (num_decodes, 1, 1, max_decode_len) bool, True = attend
    prefills: list[CPUPrefill]


def _slots(block_table_row: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    return block_table_row[positions // block_size].long() * block_size + positions % block_size


class CPUAttentionMetadataBuilder(AttentionMetadataBuilder):
    """Computes token slots and masks once per step (shared by all layers)."""

    def build(self, common: CommonAttentionMetadata) -> CPUAttentionMetadata:
        bs = common.block_size
        qsl = common.query_start_loc_cpu.tolist()
        seq_lens = common.seq_lens_cpu.tolist()
        block_table = common.block_table.cpu()
        window = self.layer_spec.sliding_window
        group = self.layer_spec.num_heads // self.layer_spec.num_kv_heads
        nd = common.num_decodes

        dec_lens = torch.tensor(seq_lens[:nd], dtype=torch.int64)
        width = int(dec_lens.max()) if nd else 0
        positions = torch.arange(width).expand(nd, width)
        valid = positions < dec_lens[:, None]
        if window is not None:  # the decode token at position L-1 sees positions > L-1-window
            valid &= positions > (dec_lens[:, None] - 1 - window)
        safe = torch.where(valid, positions, 0)
        decode_slots = torch.gather(block_table[:nd].long(), 1, safe // bs) * bs + safe % bs

        prefills = []
        for i in range(nd, common.num_reqs):
            q_len, seq_len = qsl[i + 1] - qsl[i], seq_lens[i]
            mask = None
            if q_len > 1 or (window is not None and seq_len > window):
                mask = causal_mask(q_len, seq_len, window).repeat(group, 1)
            prefills.append(CPUPrefill(qsl[i], qsl[i + 1], _slots(block_table[i], torch.arange(seq_len), bs), mask))
        return CPUAttentionMetadata(
            slot_mapping=common.slot_mapping,
            num_decodes=nd,
            decode_slots=decode_slots,
            decode_mask=valid[:, None, None, :],
            prefills=prefills,
        )


# below this many attention scores per request, explicit matmuls beat SDPA's CPU kernel, whose fixed cost per
# call dominates small problems; above it SDPA avoids materializing the scores
_SMALL_SCORES = 1 << 22


def _soft_cap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(scores / cap)`` (Gemma 2's attention logits soft cap); ``scores`` unchanged for None."""
    return scores if cap is None else torch.tanh(scores / cap) * cap


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(cap(q k^T * scale), masked) v for q (B, M, D), k/v (B, N, D), mask (M, N) bool or None; ``sinks``
    (B, M, 1): a sink logit per row (``reference.softmax_with_sinks``)."""
    if soft_cap is None and sinks is None and q.shape[0] * q.shape[1] * k.shape[1] > _SMALL_SCORES:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = _soft_cap(torch.bmm(q, k.transpose(1, 2)) * scale, soft_cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.bmm(softmax_with_sinks(scores, sinks), v)


class CPUAttentionImpl(AttentionImpl):
    """Attention over the paged cache with GQA by grouping, never by copying K/V.

    The G query heads that share a KV head are stacked: decodes as ``(B, Hkv, G, D)`` against keys
    ``(B, Hkv, L, D)``, prefills as ``(Hkv, G * q_len, D)`` so the matmul batch is the KV heads (SDPA's
    own ``enable_gqa`` is far slower on CPU). Attention sinks: a sink column in each head's softmax.
    """

    supports_sinks = True

    def kv_write_target(self, kv_cache, metadata: CPUAttentionMetadata) -> KVWriteTarget:
        return KVWriteTarget(*kv_views(kv_cache, 0), metadata.slot_mapping, self.k_scale, self.v_scale)

    def _read(self, cached: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
        """Gathered cache entries in the model dtype: an fp8 cache's values times its scale."""
        x = cached.to(dtype)
        return x.mul_(scale) if cached.dtype in FP8_DTYPES and scale != 1.0 else x

    def forward(
        self, query, key, value, kv_cache, metadata: CPUAttentionMetadata, kv_written: bool = False
    ) -> torch.Tensor:
        if not kv_written:
            self.kv_write_target(kv_cache, metadata).write(key, value)
        out = torch.empty_like(query)
        hkv, d = self.num_kv_heads, self.head_size
        k_flat = kv_cache[0].reshape(-1, hkv, d)
        v_flat = kv_cache[1].reshape(-1, hkv, d)
        nd = metadata.num_decodes
        if nd:
            slots = metadata.decode_slots
            q = query[:nd].view(nd, hkv, -1, d)  # head h uses KV head h // G
            k = self._read(k_flat[slots], self.k_scale, q.dtype).permute(0, 2, 3, 1)  # (B, Hkv, D, L)
            v = self._read(v_flat[slots], self.v_scale, q.dtype).transpose(1, 2)  # (B, Hkv, L, D)
            scores = _soft_cap(torch.matmul(q, k) * self.scale, self.logits_soft_cap)  # (B, Hkv, G, L)
            scores = scores.masked_fill(~metadata.decode_mask, float("-inf"))
            sinks = None if self.sinks is None else self.sinks.view(hkv, -1, 1)  # (Hkv, G, 1), as q's heads
            out[:nd] = torch.matmul(softmax_with_sinks(scores, sinks), v).reshape(nd, self.num_heads, d)
        for r in metadata.prefills:
            q_len = r.query_end - r.query_start
            # (q_len, Hq, D) -> (Hq, q_len, D) -> (Hkv, G * q_len, D)
            q = query[r.query_start : r.query_end].transpose(0, 1).reshape(hkv, -1, d)
            k = self._read(k_flat.index_select(0, r.token_slots), self.k_scale, q.dtype).transpose(0, 1)  # (Hkv, L, D)
            v = self._read(v_flat.index_select(0, r.token_slots), self.v_scale, q.dtype).transpose(0, 1)
            sinks = None if self.sinks is None else self.sinks.view(hkv, -1, 1).repeat_interleave(q_len, dim=1)
            o = _attend(q, k, v, r.mask, self.scale, self.logits_soft_cap, sinks)  # sinks (Hkv, G * q_len, 1)
            out[r.query_start : r.query_end] = o.reshape(self.num_heads, q_len, d).transpose(0, 1)
        return out


class CPUAttentionBackend(AttentionBackend):
    """Paged attention on the CPU in PyTorch; any head size and block size; sliding window, logits soft cap."""

    name = "CPU_ATTN"
    device_types = ("cpu",)
    supported_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    supported_head_sizes = None
    supported_block_sizes = None
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True
    cuda_graph_support = CudaGraphSupport.NEVER

    @classmethod
    def extra_reasons(cls, selector_config, platform, attention_config=None) -> list[Reason]:
        if attention_config is not None and attention_config.use_prefill_decode_attention:
            return [separate_calls(cls.name)]
        return []

    @staticmethod
    def get_impl_cls() -> type[CPUAttentionImpl]:
        return CPUAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[CPUAttentionMetadataBuilder]:
        return CPUAttentionMetadataBuilder
