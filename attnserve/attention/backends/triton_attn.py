"""TRITON_ATTN: our paged-attention kernels in Triton (``kernels/triton_attention.py``).

Per step the builder cuts the batch into query tiles (host side, once); each layer then makes one kernel
call per kind of token: a decode-only step one call over its decode tiles (16 rows: one token's query heads,
padded), a step with prefill tokens a call over its decode tokens (if any) and one over its prefill tokens in
tiles of 64 rows (``_PREFILL_ROWS``: each KV tile loaded for 4x the query tokens; 16-bit queries). A decode call too small to
fill the GPU takes the split-KV kernel (up to 32 splits of at least one 64-token KV tile). Since decodes and
prefills always run as separate calls, ``use_prefill_decode_attention`` is refused (it would change nothing).
A cascade step (``attention/cascade.py``, CUDA graphs; 16-bit cache, no window) is two calls into one buffer of
partial results, merged once: every query token over the shared prefix (one sequence of prefill tiles,
non-causal) and each request over its suffix (decode tiles), each call with its own split count.
The kernels launch with programmatic dependent launch on sm_90+ (``kernels/pdl.py``), so the RoPE + KV-write
kernel before them and the GEMV after them overlap their launches. New K/V go into the cache with the
Triton ``reshape_and_cache`` kernel; an fp8 cache (e4m3 or e5m2) stores ``x / scale`` per tensor, saturated (the
layer's scales: the checkpoint's, calculate_kv_scales' or 1.0); the kernels fold the scales into the softmax
scale and the output and dot fp8 tiles as float16 (``attention_tiles.default_fp8_dot``), in tiles of twice the
tokens (``FP8_KV_TILE_TOKENS``). Decode calls over an fp8 cache run the keys-major kernel instead
(``kernels/triton_fp8_decode.py``: the KV tile as the dots' M side, the query rows padded to 8, not 16)
where it applies (no window, soft cap or sinks; its ``supports``); those steps rotate and write K/V with the
RoPE + KV-write kernel first. Where Triton has Gluon, its unsplit calls run the Gluon kernel instead
(``kernels/gluon_fp8_decode.py``: a cp.async ring, no byte-wide shared loads; ``ATTNSERVE_GLUON_FP8_DECODE=0``: not).
Decode timings against FlashInfer (``benchmarks/gpu/bench_triton_decode.py``): docs/benchmarks.md.

Limits: any CUDA GPU Triton compiles for (compute capability >= 7.0, the minimum of Triton's NVIDIA
backend and of torch.compile's GPU path); float32 as well as float16/bfloat16; head sizes >= 32 (the
kernel pads to the next power of two); block sizes 16, 32, 64, 128 and 256 (a page is one power-of-two
tile); fp8 KV cache; sliding window and logits
soft cap; attention sinks (a learned logit per query head in the softmax); runs whole mixed batches, so CUDA
graphs can capture any step.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from attnserve.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionType,
    CudaGraphSupport,
)
from attnserve.attention.backends.triton_attn_plan import (
    TritonAttentionMetadata,
    TritonAttentionMetadataBuilder,
    TritonAttentionTiles,
)
from attnserve.kernels.fused_ops import RopeInputs
from attnserve.kernels.kv_write import KVWriteTarget, kv_views
from attnserve.refusals import Reason
from attnserve.refusals.backends import separate_calls


class TritonAttentionImpl(AttentionImpl):
    """Writes K/V with the Triton kernel, then runs the metadata's kernel calls."""

    kv_dim = 1  # cache shape (num_blocks, 2, block_size, Hkv, D)
    supports_sinks = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from attnserve.kernels import gluon_fp8_decode, triton_attention, triton_fp8_decode

        self._ops = triton_attention
        self._fp8_ops = triton_fp8_decode
        spec = self.spec
        # decode calls over an fp8 cache take the keys-major kernel where it applies (its docstring)
        self._fp8_decode_layer = (
            spec.kv_cache_dtype != "auto"
            and spec.sliding_window is None
            and spec.logits_soft_cap is None
            and triton_fp8_decode.supports(spec.head_size, spec.num_heads // spec.num_kv_heads)
        )
        # its unsplit calls take the Gluon kernel instead where it is switched on (gluon_fp8_decode.enabled)
        self._gluon_fp8 = (
            self._fp8_decode_layer
            and gluon_fp8_decode.enabled()
            and gluon_fp8_decode.supports(spec.head_size, spec.num_heads // spec.num_kv_heads)
        )
        self._gluon_ops = gluon_fp8_decode

    def _keys_major(self, call: TritonAttentionTiles, query: torch.Tensor) -> bool:
        """Whether ``call`` runs ``triton_fp8_decode.fp8_decode_attention``: a decode call over an fp8 cache,
        in a layer without window, soft cap or sinks that the kernel supports."""
        return call.decode and self._fp8_decode_layer and self.sinks is None and query.dtype != torch.float32

    def kv_write_target(self, kv_cache, metadata: TritonAttentionMetadata) -> KVWriteTarget:
        return KVWriteTarget(*kv_views(kv_cache, self.kv_dim), metadata.slot_mapping, self.k_scale, self.v_scale)

    def forward_with_rope(
        self, query, key, value, kv_cache, metadata: TritonAttentionMetadata, rope: RopeInputs
    ) -> torch.Tensor | None:
        """A decode step whose one kernel call has one program per request and KV head (no KV split, 4 warps:
        batch x Hkv >= 2 programs per SM): RoPE, the KV write and attention in that kernel
        (``paged_attention(rope=...)``), instead of the RoPE + KV-write kernel and then the attention kernel.
        None for every other step. Saves one RoPE + KV-write kernel per layer."""
        if len(metadata.calls) != 1:
            return None
        call = metadata.calls[0]
        if not call.decode or call.num_splits != 1 or call.launch.get("num_warps", 4) != 4:
            return None
        if self._keys_major(call, query):  # that kernel does not rotate or write
            return None
        key_cache, value_cache = kv_views(kv_cache, self.kv_dim)
        decode_rope = self._ops.DecodeRope(
            rope.positions, key, value, rope.cos_cache, rope.sin_cache, metadata.slot_mapping, rope.q_norm, rope.k_norm
        )
        return self._attend(query, key_cache, value_cache, metadata, decode_rope)

    def forward(
        self, query, key, value, kv_cache, metadata: TritonAttentionMetadata, kv_written: bool = False
    ) -> torch.Tensor:
        key_cache, value_cache = kv_views(kv_cache, self.kv_dim)
        if not kv_written:
            self.kv_write_target(kv_cache, metadata).write(key, value)
        return self._attend(query, key_cache, value_cache, metadata)

    def _attend(self, query, key_cache, value_cache, metadata: TritonAttentionMetadata, rope=None) -> torch.Tensor:
        out = torch.empty_like(query)
        if metadata.calls[0].cascade is not None:
            return self._cascade(out, query, key_cache, value_cache, metadata)
        for call in metadata.calls:
            if rope is None and self._keys_major(call, query):
                first, end = call.token_range  # decode tiles: request i is token i
                gluon = self._gluon_fp8 and call.num_splits == 1
                kernel = self._gluon_ops.gluon_fp8_decode_attention if gluon else self._fp8_ops.fp8_decode_attention
                kernel(
                    out[first:end],
                    query[first:end],
                    key_cache,
                    value_cache,
                    metadata.block_table[first:end],
                    metadata.seq_lens[first:end],
                    self.scale,
                    k_scale=self.k_scale,
                    v_scale=self.v_scale,
                    **({} if gluon else {"num_splits": call.num_splits}),
                )
                continue
            self._paged(
                call,
                out,
                query,
                key_cache,
                value_cache,
                (metadata.block_table, metadata.seq_lens, metadata.query_start_loc),
                split_token_range=call.token_range,
                rope=rope,
                sinks=self.sinks,
            )
        return out

    def _paged(self, call: TritonAttentionTiles, out, query, key_cache, value_cache, step: tuple, **kw) -> None:
        """``paged_attention`` over ``call``'s tiles with the layer's scores and scales; ``step``: (block table,
        sequence lengths, query start locations) the tiles index; ``kw``: the call's other arguments."""
        table, seq_lens, query_start_loc = step
        self._ops.paged_attention(
            out,
            query,
            key_cache,
            value_cache,
            table,
            seq_lens,
            query_start_loc,
            call.tile_seq,
            call.tile_start,
            self.scale,
            num_splits=call.num_splits,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            launch=call.launch,
            decode=call.decode,
            ordered=call.ordered,
            block_m=call.block_m,
            pages_per_tile=call.pages_per_tile,
            **kw,
        )

    def _cascade(self, out, query, key_cache, value_cache, metadata: TritonAttentionMetadata) -> torch.Tensor:
        """A cascade step: the prefix call writes its splits' partial results (slots ``0 .. P-1``); an unsplit
        suffix call folds them into its own and writes the output (``paged_attention(fold=True)``: no merge
        kernel, no suffix slots), a split one writes slots ``P .. P+S-1`` and one merge
        (``merge_splits``) reads all. The sinks, if any, join the prefix call only (its split 0), so that the
        softmax counts them once."""
        from attnserve.kernels.triton_attention import padded_head_size
        from attnserve.kernels.triton_merge_splits import merge_splits, partial_results

        prefix, suffix = metadata.calls
        p = prefix.cascade
        num_tokens, num_heads, head = query.shape
        fold = suffix.num_splits == 1
        slots = prefix.num_splits + (0 if fold else suffix.num_splits)
        parts = partial_results(num_tokens, num_heads, slots, padded_head_size(head), query.device)
        step = (metadata.block_table, metadata.seq_lens, metadata.query_start_loc)
        prefix_step = (p.block_table, p.seq_lens, p.query_start_loc)
        self._paged(
            prefix, out, query, key_cache, value_cache, prefix_step, causal=False, sinks=self.sinks, parts=parts
        )
        if fold:
            self._paged(suffix, out, query, key_cache, value_cache, step, parts=parts, fold=True)
            return out
        self._paged(suffix, out, query, key_cache, value_cache, step, parts=parts, part_base=prefix.num_splits)
        merge_splits(out, *parts, prefix.token_range, head)
        return out


class TritonAttentionBackend(AttentionBackend):
    name: ClassVar[str] = "TRITON_ATTN"
    supported_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    min_head_size = 32
    # a page is one tl.arange in the kernel: a power of two (48 would pass "multiples of 16" and fail to compile)
    supported_block_sizes = (16, 32, 64, 128, 256)
    min_compute_capability = (7, 0)
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True
    supported_attn_types = (AttentionType.DECODER,)
    device_types = ("cuda",)
    required_package = "triton"
    pip_extra = "triton"
    cuda_graph_support = CudaGraphSupport.ALWAYS

    @classmethod
    def extra_reasons(cls, selector_config, platform, attention_config=None) -> list[Reason]:
        if attention_config is not None and attention_config.use_prefill_decode_attention:
            return [separate_calls(cls.name)]
        return []

    @staticmethod
    def get_impl_cls() -> type[TritonAttentionImpl]:
        return TritonAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[TritonAttentionMetadataBuilder]:
        return TritonAttentionMetadataBuilder

    @classmethod
    def get_kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        """``(num_blocks, 2, block_size, num_kv_heads, head_size)``, as vLLM's Triton kernel reads it."""
        return (num_blocks, 2, block_size, num_kv_heads, head_size)
