"""TRITON_ATTN's per-step plan: the builder cuts a step into query tiles once and chooses its kernel calls (decode
tiles, split-KV where they do not fill the GPU; prefill tiles; a cascade step's prefix and suffix calls), each
with its launch options. ``triton_attn.py``'s module docstring describes the calls; its Impl runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnserve.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata
from attnserve.attention.cascade import CascadePrefix

# Split-KV decode: aim for this many programs per SM, with at most this many splits of at least one KV tile
# each (``triton_attention.kv_tile_tokens``: 64 tokens for 16-bit head 128): long splits leave a batch-1
# decode too few programs (chosen by benchmarks/gpu/bench_decode_layout.py; see docs/benchmarks.md).
_PROGRAMS_PER_SM = 2
_MAX_SPLITS = 32
# Launch options of decode calls (one query token per request), by whether KV is split: a 2-stage pipeline
# (Triton's default is 3), and 8 warps for the short split programs (chosen by
# ``benchmarks/gpu/bench_triton_decode.py --sweep``; see docs/benchmarks.md).
_DECODE_LAUNCH = {False: {"num_stages": 2}, True: {"num_stages": 2, "num_warps": 8}}
# the same over an fp8 cache (its KV tiles: ``attention_tiles.FP8_KV_TILE_TOKENS``; its dots:
# ``triton_attention.default_fp8_dot``): a 3-stage pipeline for unsplit programs, chosen by
# ``benchmarks/gpu/bench_fp8_decode.py`` (docs/benchmarks.md, "FP8 KV cache")
_FP8_DECODE_LAUNCH = {False: {"num_stages": 3}, True: {"num_stages": 2, "num_warps": 8}}
# decode calls take their requests longest context first (``TritonAttentionTiles.ordered``): 7% off the kernel
# (``benchmarks/gpu/bench_decode_order.py``), 4% more output tok/s on the nano-vllm workload (``decode_order_ab.py``),
# graphs sort on the device (``tests/gpu/test_cuda_graphs.py -k longest_first``); docs/benchmarks.md, decode order
ORDER_DECODES = True
# Prefill calls: query tiles of 64 rows (16 tokens x 4 query heads at GQA 4; ``block_m_for``) over KV tiles of 64
# tokens, with 4 warps and 2 stages, for 16-bit queries (over a 16-bit or an fp8 cache) and pages of at most 64
# tokens; otherwise the decode tiles' 16 rows and the default KV tiles (chosen by
# ``benchmarks/gpu/bench_triton_prefill.py``: 1.8-2.5x faster than 16 rows at heads 64, 128 and 256 and over
# an fp8 cache; see docs/benchmarks.md)
_PREFILL_ROWS = 64
_PREFILL_KV_TOKENS = 64
_PREFILL_LAUNCH = {"num_warps": 4, "num_stages": 2}


def cascade_prefix_splits(programs: int, num_sms: int, prefix_tiles: int) -> int:
    """A cascade prefix call's split count: enough for ``_PROGRAMS_PER_SM`` programs per SM over its ``programs``
    query tiles x KV heads, at most ``_MAX_SPLITS`` and ``prefix_tiles`` (its KV tiles), rounded down to a power of
    two (batch 256 at Qwen3-0.6B's heads: 4, not 8; ``benchmarks/gpu/bench_cascade_step.py``)."""
    wanted = max(1, min(_MAX_SPLITS, -(-_PROGRAMS_PER_SM * num_sms // programs), prefix_tiles))
    return 1 << (wanted.bit_length() - 1)


@dataclass
class TritonAttentionTiles:
    """One kernel call's query tiles: request index and first query token of each tile."""

    tile_seq: torch.Tensor  # (num_tiles,) int32 on device
    tile_start: torch.Tensor  # (num_tiles,) int32 on device
    num_splits: int  # > 1: split-KV kernel over these tiles
    token_range: tuple[int, int]  # the query tokens [first, end) these tiles cover
    launch: dict = field(default_factory=dict)  # the kernel's launch options (``paged_attention(launch=)``)
    decode: bool = False  # every tile is one decode token (one query token per request)
    block_m: int = 16  # query rows of a tile (``paged_attention(block_m=)``)
    pages_per_tile: int | None = None  # pages of a KV tile (``paged_attention(pages_per_tile=)``; None: its default)
    cascade: CascadePrefix | None = None  # a cascade's prefix call: every query token over this shared prefix
    # decode tiles longest context first (``tile_seq``: request indices), a request's KV heads together
    # (``paged_attention(ordered=True)``): a step's long contexts are not left to run last on a few SMs
    ordered: bool = False


@dataclass
class TritonAttentionMetadata:
    """TRITON_ATTN's per-step arguments: the common tensors and one or two tile lists."""

    slot_mapping: torch.Tensor  # (T,) int64
    query_start_loc: torch.Tensor  # (B + 1,) int32
    seq_lens: torch.Tensor  # (B,) int32
    block_table: torch.Tensor  # (B, max_blocks) int32
    calls: list[TritonAttentionTiles]  # kernel calls of each layer, in order


class TritonAttentionMetadataBuilder(AttentionMetadataBuilder):
    """Cuts the step into query tiles once and chooses its calls: decode tiles (split-KV where they do not fill
    the GPU), prefill tiles, or a cascade step's prefix and suffix calls."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        spec = self.layer_spec
        self.num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count if self.device.type == "cuda" else 1
        )
        self.kv_fp8 = spec.kv_cache_dtype != "auto"
        self.decode_launch = _FP8_DECODE_LAUNCH if self.kv_fp8 else _DECODE_LAUNCH

    def _splits(self, num_decodes: int, max_seq_len: int, block_size: int) -> int:
        """Split-KV count for a decode call: 1 when ``num_decodes * Hkv`` programs already fill the GPU (or
        the context is one KV tile); else enough splits for ``_PROGRAMS_PER_SM`` programs per SM, at most
        ``_MAX_SPLITS`` and at most one per KV tile of ``max_seq_len`` tokens."""
        from attnserve.kernels.triton_attention import kv_tile_tokens

        spec = self.layer_spec
        programs = num_decodes * spec.num_kv_heads
        tile = kv_tile_tokens(block_size, spec.head_size, max(2, self.dtype.itemsize), 1 if self.kv_fp8 else None)
        tiles = -(-max_seq_len // tile)
        if tiles < 2 or programs >= _PROGRAMS_PER_SM * self.num_sms:
            return 1
        return min(_MAX_SPLITS, -(-_PROGRAMS_PER_SM * self.num_sms // programs), tiles)

    def _prefill_tiling(self, block_size: int) -> tuple[int, dict, int | None]:
        """(rows, launch options, pages per KV tile) of prefill tiles: ``_PREFILL_ROWS`` rows over
        ``_PREFILL_KV_TOKENS``-token KV tiles for 16-bit queries and pages of at most that many tokens; else
        16 rows, the default launch and KV tiles."""
        if self.dtype.itemsize == 2 and block_size <= _PREFILL_KV_TOKENS:
            return _PREFILL_ROWS, dict(_PREFILL_LAUNCH), _PREFILL_KV_TOKENS // block_size
        return 16, {}, None

    def _tiles(
        self,
        common: CommonAttentionMetadata,
        first: int,
        last: int,
        splits: int,
        decode: bool = False,
        ordered: bool = False,
    ) -> TritonAttentionTiles:
        """The call over requests ``[first, last)``: decode tiles (16 rows), else prefill tiles. ``ordered`` (decode
        tiles of requests from 0): the tiles longest context first (``paged_attention(ordered=True)``)."""
        from attnserve.kernels.triton_attention import block_m_for, query_tiles

        spec = self.layer_spec
        if decode:
            rows, launch, pages = 16, self.decode_launch[splits > 1], None
        else:
            rows, launch, pages = self._prefill_tiling(common.block_size)
        seq, start = query_tiles(
            common.query_start_loc_cpu, block_m_for(spec.num_heads // spec.num_kv_heads, rows)[1], first, last
        )
        qsl = common.query_start_loc_cpu
        ordered = ordered and decode and first == 0
        if ordered:
            seq = torch.from_numpy(np.argsort(-common.seq_lens_cpu[:last].numpy(), kind="stable").astype(np.int32))
        return TritonAttentionTiles(
            seq.to(self.device, non_blocking=True),
            start.to(self.device, non_blocking=True),
            splits,
            (int(qsl[first]), int(qsl[last])),
            launch,
            decode,
            rows,
            pages,
            ordered=ordered,
        )

    def cudagraph_prologue(self, metadata: TritonAttentionMetadata) -> None:
        """Each ordered decode call's tiles sorted again from the static sequence lengths, on the device: a
        replay's contexts are not the capture's."""
        for call in metadata.calls:
            if call.ordered:
                call.tile_seq.copy_(torch.argsort(metadata.seq_lens[: call.tile_seq.numel()], descending=True))

    @property
    def supports_cascade(self) -> bool:
        """A 16-bit cache without a sliding window (the prefix call is non-causal, and its tiles are 16-bit)."""
        return not self.kv_fp8 and self.layer_spec.sliding_window is None

    def _cascade_calls(self, common: CommonAttentionMetadata) -> list[TritonAttentionTiles]:
        """A cascade decode step (``attention/cascade.py``; ``common``'s table and lengths are the suffixes'): the
        prefix call (every query token as one sequence of prefill tiles over the shared prefix, non-causal) and the
        suffix call (decode tiles), each with its own power-of-two split count; the prefix call writes partial
        results (a (head size,) float32 row per token, head and split) that the suffix call folds in or, split
        itself, a merge reads with its own (``TritonAttentionImpl._cascade``). The counts: ``cascade_prefix_splits`` and ``_splits``."""
        from attnserve.kernels.triton_attention import block_m_for, kv_tile_tokens, next_power_of_2, query_tiles

        spec, p, n = self.layer_spec, common.cascade, common.num_reqs
        rows, launch, pages = self._prefill_tiling(common.block_size)
        block_q = block_m_for(spec.num_heads // spec.num_kv_heads, rows)[1]
        seq, start = query_tiles(torch.tensor([0, n], dtype=torch.int32), block_q)  # one sequence of n tokens
        tile = (
            pages * common.block_size
            if pages
            else kv_tile_tokens(common.block_size, spec.head_size, self.dtype.itemsize)
        )
        programs = seq.numel() * spec.num_kv_heads
        prefix_splits = cascade_prefix_splits(programs, self.num_sms, p.max_len // tile)
        suffix_splits = next_power_of_2(self._splits(n, common.max_seq_len, common.block_size))
        prefix = TritonAttentionTiles(
            seq.to(self.device, non_blocking=True),
            start.to(self.device, non_blocking=True),
            prefix_splits,
            (0, n),
            launch,
            False,
            rows,
            pages,
            p,
        )
        return [prefix, self._tiles(common, 0, n, suffix_splits, decode=True)]

    def build(self, common: CommonAttentionMetadata) -> TritonAttentionMetadata:
        """A decode-only step: one call, split-KV when too small to fill the GPU (a cascade step: its prefix and
        suffix calls). Else the decodes (if any: the same rule over their longest context), then the prefills."""
        nd, b = common.num_decodes, common.num_reqs
        if common.cascade is not None:
            calls = self._cascade_calls(common)
        elif nd == b:
            splits = self._splits(nd, common.max_seq_len, common.block_size)
            calls = [self._tiles(common, 0, b, splits, decode=common.max_query_len == 1, ordered=ORDER_DECODES)]
        else:
            calls = []
            if nd:
                longest = int(common.seq_lens_cpu[:nd].max())
                splits = self._splits(nd, longest, common.block_size)
                calls.append(self._tiles(common, 0, nd, splits, decode=True, ordered=ORDER_DECODES))
            calls.append(self._tiles(common, nd, b, 1))
        return TritonAttentionMetadata(
            common.slot_mapping, common.query_start_loc, common.seq_lens, common.block_table, calls
        )
