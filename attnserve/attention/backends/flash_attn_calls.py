"""FLASH_ATTN's metadata builder and Impl: the kernel calls of FlashAttention 2, 3 or 4 (see ``flash_attn.py``
for the versions and ``flash_attn_cascade.py`` for cascade attention's calls)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnserve.attention.backend import AttentionImpl, AttentionMetadataBuilder, CommonAttentionMetadata
from attnserve.attention.backends.flash_attn_cascade import PrefixCall, paged_cascade
from attnserve.attention.backends.flash_attn_versions import FLASH_ATTN_VERSIONS, installed_version, load_kernels
from attnserve.kernels.kv_write import FP8_DTYPES, KVWriteTarget, kv_views

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.config.attention import AttentionConfig


def graph_num_splits(attention_config: "AttentionConfig | None") -> int:
    """FlashAttention 3's split-KV bound in CUDA-graph decode steps (the plan splits each request up to this many
    times for its own length): ``attention_config.flash_attn_max_num_splits_for_cuda_graph`` (vLLM's default 32;
    8, 16 and 32 time the same in ``benchmarks/gpu/bench_fa3_decode.py``, see docs/benchmarks.md)."""
    from attnserve.config.attention import AttentionConfig

    return (attention_config or AttentionConfig()).flash_attn_max_num_splits_for_cuda_graph


@dataclass
class FlashAttentionCall:
    """One kernel call over requests [first, last) of the step."""

    decode: bool  # every request has query length 1
    query_start: int  # token range [query_start, query_end) of the call
    query_end: int
    query_start_loc: torch.Tensor  # (n + 1,) int32, from 0
    seq_lens: torch.Tensor  # (n,) int32
    block_table: torch.Tensor  # (n, max_blocks) int32
    cu_seqlens_k: torch.Tensor | None  # (n + 1,) int32, FlashAttention 2 only
    max_query_len: int
    max_seq_len: int
    scheduler_metadata: torch.Tensor | None  # FlashAttention 3's split-KV plan for this call
    fresh: bool = False  # every request's whole context is in this step (prefill of new prompts only)
    num_splits: int = 0  # FlashAttention 3's split-KV bound (0: its heuristic); the plan's, when there is one
    page_size: int = 0  # the KV cache's block size (for the plan made inside a CUDA graph)
    prefix: PrefixCall | None = None  # cascade: the shared prefix's call; the fields above are the suffix's

    def paged_args(self) -> dict:
        """FlashAttention 3's ``flash_attn_with_kvcache`` arguments for this call's requests over the paged cache."""
        return dict(
            cache_seqlens=self.seq_lens,
            page_table=self.block_table,
            cu_seqlens_q=self.query_start_loc,
            max_seqlen_q=self.max_query_len,
            causal=True,
            scheduler_metadata=self.scheduler_metadata,
            num_splits=self.num_splits,
        )


@dataclass
class FlashAttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) int64
    calls: list[FlashAttentionCall]


class FlashAttentionMetadataBuilder(AttentionMetadataBuilder):
    """Resolves the version once; per step slices the batch into one or two calls and, for version 3,
    computes the scheduler metadata (how many KV splits each request gets) once for all layers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.version = installed_version(self.attention_config, self.device)
        self.fa = load_kernels(self.version)
        cfg = self.attention_config
        self.prefill_decode = bool(cfg is not None and cfg.use_prefill_decode_attention)

    def _call(
        self, common: CommonAttentionMetadata, first: int, last: int, plan_splits: bool = True
    ) -> FlashAttentionCall:
        qsl_cpu = common.query_start_loc_cpu
        q0, q1 = int(qsl_cpu[first]), int(qsl_cpu[last])
        qsl = common.query_start_loc[first : last + 1] - q0 if first else common.query_start_loc[: last + 1]
        seq_lens = common.seq_lens[first:last]
        q_lens = common.query_lens_cpu[first:last]
        max_q, max_k = int(q_lens.max()), int(common.seq_lens_cpu[first:last].max())
        cu_k = None
        if self.version == 2:
            cu_k = torch.zeros(last - first + 1, dtype=torch.int32, device=self.device)
            cu_k[1:] = torch.cumsum(seq_lens, 0)
        sched = None
        if self.version == 3 and plan_splits:
            sched = self._split_plan(seq_lens, qsl, max_q, max_k, common.block_size)
        fresh = max_q > 1 and common.cascade is None and bool((common.seq_lens_cpu[first:last] == q_lens).all())
        call = FlashAttentionCall(
            max_q == 1, q0, q1, qsl, seq_lens, common.block_table[first:last], cu_k, max_q, max_k, sched, fresh
        )
        if common.cascade is not None:
            call.prefix = PrefixCall(common.cascade)
            if plan_splits:
                call.prefix.scheduler_metadata = self._prefix_plan(call.prefix, q1 - q0, common.block_size)
        return call

    def _split_plan(
        self,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        max_q: int,
        max_k: int,
        page_size: int,
        num_splits: int = 0,
        causal: bool = True,
    ) -> torch.Tensor:
        """FlashAttention 3's scheduler metadata (KV splits per request) for this layer spec's heads, window,
        soft cap and KV dtype: one small kernel on the device."""
        spec = self.layer_spec
        window = (spec.sliding_window - 1, 0) if spec.sliding_window else (-1, -1)
        fp8 = spec.kv_cache_dtype != "auto"
        return self.fa.get_scheduler_metadata(
            seq_lens.numel(),
            max_q,
            max_k,
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_size,
            seq_lens,
            qkv_dtype=torch.float8_e4m3fn if fp8 else self.dtype,
            cu_seqlens_q=query_start_loc,
            page_size=page_size,
            causal=causal,
            window_size=window,
            has_softcap=spec.logits_soft_cap is not None,
            num_splits=num_splits,
        )

    def _prefix_plan(self, call: PrefixCall, num_tokens: int, page_size: int, num_splits: int = 0) -> torch.Tensor:
        """The split plan of a cascade's prefix call: one sequence of ``num_tokens`` queries, non-causal."""
        p = call.prefix
        return self._split_plan(p.seq_lens, p.query_start_loc, num_tokens, p.max_len, page_size, num_splits, False)

    @property
    def supports_cascade(self) -> bool:
        """FlashAttention 3 over a 16-bit cache, no sliding window (the prefix call is non-causal), one call per
        step (not ``use_prefill_decode_attention``)."""
        spec = self.layer_spec
        return (
            self.version == 3 and spec.kv_cache_dtype == "auto" and not spec.sliding_window and not self.prefill_decode
        )

    def build(self, common: CommonAttentionMetadata) -> FlashAttentionMetadata:
        nd, b = common.num_decodes, common.num_reqs
        if self.prefill_decode and 0 < nd < b:
            calls = [self._call(common, 0, nd), self._call(common, nd, b)]
        else:
            calls = [self._call(common, 0, b)]
        return FlashAttentionMetadata(common.slot_mapping, calls)

    def build_for_cudagraph_capture(self, common: CommonAttentionMetadata) -> FlashAttentionMetadata:
        """One decode call on the static buffers. For FlashAttention 3 its split plan is made on the device
        by :meth:`cudagraph_prologue`, inside the graph, once per step for every layer."""
        call = self._call(common, 0, common.num_reqs, plan_splits=False)
        if self.version == 3:
            call.num_splits, call.page_size = graph_num_splits(self.attention_config), common.block_size
        return FlashAttentionMetadata(common.slot_mapping, [call])

    def cudagraph_prologue(self, metadata: FlashAttentionMetadata) -> None:
        """FlashAttention 3: ``get_scheduler_metadata`` (one small kernel) on the static ``seq_lens``, captured
        at the head of the decode graph, so each replay plans the splits for its own lengths and no layer
        plans again (without it each layer's call runs that planning kernel itself)."""
        if self.version != 3:
            return
        call = metadata.calls[0]
        call.scheduler_metadata = self._split_plan(
            call.seq_lens,
            call.query_start_loc,
            1,
            call.block_table.shape[1] * call.page_size,
            call.page_size,
            call.num_splits,
        )
        if call.prefix is not None:
            p = call.prefix
            p.scheduler_metadata = self._prefix_plan(
                p, call.query_end - call.query_start, call.page_size, call.num_splits
            )


class FlashAttentionImpl(AttentionImpl):
    """Writes K/V (Triton kernel), then one FlashAttention call per metadata call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.version = installed_version(self.attention_config, torch.device("cuda"))
        self.fa = load_kernels(self.version)
        self.window = (self.sliding_window - 1, 0) if self.sliding_window else (-1, -1)
        self.softcap = self.logits_soft_cap or 0.0
        self.supports_sinks = FLASH_ATTN_VERSIONS[self.version].sinks  # FA4's learnable_sink

    def kv_write_target(self, kv_cache, metadata: FlashAttentionMetadata) -> KVWriteTarget:
        return KVWriteTarget(*kv_views(kv_cache, 0), metadata.slot_mapping, self.k_scale, self.v_scale)

    def forward(
        self, query, key, value, kv_cache, metadata: FlashAttentionMetadata, kv_written: bool = False
    ) -> torch.Tensor:
        self.last_q_scales = []  # (first, end, scale) of each fp8-quantized query slice, for tests
        key_cache, value_cache = kv_views(kv_cache, 0)
        if not kv_written:
            self.kv_write_target(kv_cache, metadata).write(key, value)
        # key/value stay arguments either way: the fresh-prefill path below attends over them directly
        if len(metadata.calls) == 1:
            return self._attend(query, key, value, key_cache, value_cache, metadata.calls[0])
        out = torch.empty_like(query)
        for call in metadata.calls:
            s = slice(call.query_start, call.query_end)
            out[s] = self._attend(query[s], key[s], value[s], key_cache, value_cache, call)
        return out

    def _attend(self, q, k, v, key_cache, value_cache, call: FlashAttentionCall) -> torch.Tensor:
        if self.version == 3:
            if call.fresh and key_cache.dtype == q.dtype:
                # no cached context: attend over this step's contiguous K/V, not through the page table
                # (FA3's dense varlen path uses TMA loads; the paged one cannot with small pages)
                out = self.fa.flash_attn_varlen_func(
                    q,
                    k,
                    v,
                    call.query_start_loc,
                    call.query_start_loc,
                    call.max_query_len,
                    call.max_query_len,
                    softmax_scale=self.scale,
                    causal=True,
                    window_size=self.window,
                    softcap=self.softcap,
                )
                return out[0] if isinstance(out, tuple) else out
            return self._fa3(q, key_cache, value_cache, call)
        if self.version == 4:
            window = (self.window[0], 0) if self.sliding_window else (None, None)
            res = self.fa.flash_attn_varlen_func(
                q,
                key_cache,
                value_cache,
                cu_seqlens_q=call.query_start_loc,
                seqused_k=call.seq_lens,
                page_table=call.block_table,
                max_seqlen_q=call.max_query_len,
                max_seqlen_k=call.max_seq_len,
                softmax_scale=self.scale,
                causal=True,
                window_size=window,
                softcap=self.softcap,
                **({} if self.sinks is None else {"learnable_sink": self.sinks}),
            )
            return res[0] if isinstance(res, tuple) else res
        if call.decode:  # FlashAttention 2: the paged decode kernel
            out = self.fa.flash_attn_with_kvcache(
                q.unsqueeze(1),
                key_cache,
                value_cache,
                cache_seqlens=call.seq_lens,
                block_table=call.block_table,
                softmax_scale=self.scale,
                causal=True,
                window_size=self.window,
                softcap=self.softcap,
            )
            return out.squeeze(1)
        return self.fa.flash_attn_varlen_func(
            q,
            key_cache,
            value_cache,
            call.query_start_loc,
            call.cu_seqlens_k,
            call.max_query_len,
            call.max_seq_len,
            softmax_scale=self.scale,
            causal=True,
            window_size=self.window,
            softcap=self.softcap,
            block_table=call.block_table,
        )

    def _fa3(self, q, key_cache, value_cache, call: FlashAttentionCall) -> torch.Tensor:
        if call.prefix is not None:
            return paged_cascade(self.fa, q, key_cache, value_cache, call, self.scale, self.softcap)
        descales = {}
        out_dtype = q.dtype
        if key_cache.dtype in FP8_DTYPES:
            # FA3's fp8 path needs q, k and v all in e4m3: quantize q with a per-tensor scale
            shape = (call.seq_lens.numel(), self.num_kv_heads)
            q_scale = (q.abs().amax().float() / torch.finfo(key_cache.dtype).max).clamp_min(1e-12)
            q = (q.float() / q_scale).to(key_cache.dtype)
            self.last_q_scales.append((call.query_start, call.query_end, q_scale))
            descales = dict(
                q_descale=q_scale.reshape(1, 1).expand(shape).contiguous(),
                k_descale=torch.full(shape, self.k_scale, device=q.device),
                v_descale=torch.full(shape, self.v_scale, device=q.device),
            )
        out = self.fa.flash_attn_with_kvcache(
            q,
            key_cache,
            value_cache,
            softmax_scale=self.scale,
            window_size=self.window,
            softcap=self.softcap,
            **call.paged_args(),
            **descales,
        )
        out = out[0] if isinstance(out, tuple) else out
        return out if out.dtype == out_dtype else out.to(out_dtype)
