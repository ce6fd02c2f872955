"""FLASHINFER's Impl: writes K/V (our Triton kernel), then ``run()`` of each wrapper the builder planned
(:mod:`attnserve.attention.backends.flashinfer`), on its slice of the queries; an fp8-planned call gets the query
quantized once per forward with the layer's static ``q_scale``."""

from __future__ import annotations

import torch

from attnserve.attention.backend import AttentionImpl
from attnserve.attention.backends.flashinfer import FlashInferMetadata
from attnserve.kernels.kv_write import FP8_DTYPES, KVWriteTarget, kv_views


class FlashInferImpl(AttentionImpl):
    """Writes K/V (Triton kernel), then run() of each planned wrapper on its slice of the queries."""

    kv_dim = 1  # cache shape (num_blocks, 2, block_size, Hkv, D)

    def kv_write_target(self, kv_cache, metadata: FlashInferMetadata) -> KVWriteTarget:
        return KVWriteTarget(*kv_views(kv_cache, self.kv_dim), metadata.slot_mapping, self.k_scale, self.v_scale)

    def forward(
        self, query, key, value, kv_cache, metadata: FlashInferMetadata, kv_written: bool = False
    ) -> torch.Tensor:
        self.last_q_scales = []  # (first, end, scale) of each fp8-quantized query slice, for tests
        key_cache, value_cache = kv_views(kv_cache, self.kv_dim)
        if not kv_written:
            self.kv_write_target(kv_cache, metadata).write(key, value)
        # FlashInfer takes the cache in its physical order: (N, 2, B, H, D) for NHD, (N, 2, H, B, D) for HND
        physical = kv_cache if kv_cache.is_contiguous() else kv_cache.transpose(2, 3)
        assert physical.is_contiguous(), "KV cache must be NHD or HND ordered"
        fp8 = kv_cache.dtype in FP8_DTYPES
        out = torch.empty_like(query)
        query_fp8 = None  # made once, for the calls planned with an fp8 query (flashinfer_modules.query_dtypes)
        for call in metadata.calls:
            q = query[call.query_start : call.query_end]
            if call.kind == "fallback":
                from attnserve.kernels.triton_attention import paged_attention

                paged_attention(
                    out,
                    query,
                    key_cache,
                    value_cache,
                    metadata.block_table,
                    metadata.seq_lens,
                    metadata.query_start_loc,
                    *call.tiles,
                    self.scale,
                    sliding_window=self.sliding_window,
                    logits_soft_cap=self.logits_soft_cap,
                    k_scale=self.k_scale,
                    v_scale=self.v_scale,
                )
                continue
            scales = dict(k_scale=self.k_scale, v_scale=self.v_scale) if fp8 else {}
            if call.q_dtype in FP8_DTYPES:  # the cache's type, with the static q_scale, saturated
                if query_fp8 is None:
                    fmax = torch.finfo(call.q_dtype).max
                    query_fp8 = (query.float() / self.q_scale).clamp_(-fmax, fmax).to(call.q_dtype)
                q = query_fp8[call.query_start : call.query_end]
                scales["q_scale"] = self.q_scale
                self.last_q_scales.append((call.query_start, call.query_end, self.q_scale))
            call.wrapper.run(q, physical, out=out[call.query_start : call.query_end], **scales)
        return out
