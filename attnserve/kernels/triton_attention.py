"""Paged attention in Triton: ``paged_attention``, the launcher of ``triton_attention_kernel``'s kernel (one kernel
for mixed prefill/decode batches, and a split-KV variant; its design notes are that module's docstring).

The launcher picks the kernel's constants from the call's shapes and options: the query tiles' rows
(``block_m_for``), the KV tile in pages (``default_pages_per_tile``), the fp8 dot path, the split count (a power
of two; split outputs merged by ``triton_merge_splits``) and whether unmasked KV tiles run in a loop of their
own. Importing this module imports Triton: only backends import it, lazily.
"""

from __future__ import annotations

import torch

from attnserve.kernels import pdl
from attnserve.kernels.attention_tiles import (  # noqa: F401 (kv_tile_tokens, query_tiles: the builder's)
    FP8_DOT_MODES,
    block_m_for,
    default_fp8_dot,
    default_pages_per_tile,
    kv_tile_tokens,
    next_power_of_2,
    padded_head_size,
    query_tiles,
)
from attnserve.kernels.triton_merge_splits import merge_splits, partial_results
from attnserve.kernels.triton_attention_kernel import _paged_attention_kernel
from attnserve.kernels.triton_common import INTERPRETED, LAUNCH_OPTIONS
from attnserve.kernels.triton_rope import DecodeRope


# query tiles of at least this many rows walk their unmasked KV tiles in a loop of their own (``FIRST_STAGE``):
# faster for the 64-row prefill tiles, slower for 16-row prefill tiles, even for decode tiles
# (benchmarks/gpu/bench_triton_prefill.py and bench attention: docs/benchmarks.md, "TRITON_ATTN's prefill")
UNMASKED_STAGE_MIN_ROWS = 64


def first_stage(block_m: int, windowed: bool) -> int:
    """The kernel's ``FIRST_STAGE``: 0 (unmasked KV tiles first) for tiles of at least ``UNMASKED_STAGE_MIN_ROWS``
    rows without a sliding window (a window masks the first tiles too), else 1 (one masked loop)."""
    return 0 if block_m >= UNMASKED_STAGE_MIN_ROWS and not windowed else 1


# decode calls take tile i as request i's token i (``paged_attention(decode=True)``); a module switch for
# same-process A/Bs (``benchmarks/gpu/bench_engine_variants.py``)
DECODE_DIRECT = True


_ROPE_CONSTEXPRS = ("HQ", "HQ_PAD", "HK", "HK_PAD", "HALF", "HALF_PAD", "HAS_NORM", "ROUND_Q", "ROUND_K")
_NO_ROPE = dict(ROPE=False, **dict.fromkeys(_ROPE_CONSTEXPRS[:6], 1), **dict.fromkeys(_ROPE_CONSTEXPRS[6:], False))


def _rope_arguments(
    rope: DecodeRope | None, query: torch.Tensor, caches: tuple, num_splits: int, launch: dict | None
) -> tuple[tuple | None, dict]:
    """The kernel's ``rope_args`` and ROPE constexprs (placeholders without ``rope``): ``triton_rope``'s, for the
    new tokens' RoPE and their KV write to ``caches`` (key cache, value cache, k_scale, v_scale)."""
    if rope is None:
        return None, _NO_ROPE
    assert num_splits == 1, "RoPE inside the attention kernel needs one program per token and KV head"
    # the q/k norm's sums add in the RoPE kernel's order only on its tiles and warps
    assert (launch or {}).get("num_warps", 4) == 4, launch
    args, meta = rope.arguments(query, *caches)
    return args, dict(ROPE=True, **{n: meta[n] for n in _ROPE_CONSTEXPRS})


def paged_attention(
    out: torch.Tensor,  # (T, Hq, D), written for the tokens of the given tiles
    query: torch.Tensor,  # (T, Hq, D)
    key_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D), any strides, last dim contiguous
    value_cache: torch.Tensor,  # same
    block_table: torch.Tensor,  # (B, max_blocks) int32
    seq_lens: torch.Tensor,  # (B,) int32
    query_start_loc: torch.Tensor,  # (B + 1,) int32
    tile_seq: torch.Tensor,  # (num_tiles,) int32 on device, from query_tiles
    tile_start: torch.Tensor,  # (num_tiles,) int32 on device
    scale: float,
    *,
    num_splits: int = 1,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    split_token_range: tuple[int, int] | None = None,  # (first, end) tokens covered, for the merge
    pages_per_tile: int | None = None,
    launch: dict | None = None,  # extra launch options of the attention kernel (num_warps, num_stages, maxnreg)
    rope: DecodeRope | None = None,
    decode: bool = False,  # tile i is request i's one query token, token i (a decode call's tiles)
    ordered: bool = False,  # with decode: tile i is request tile_seq[i], KV heads together (longest first)
    sinks: torch.Tensor | None = None,  # (Hq,) a sink logit per query head (any float dtype)
    fp8_dot: str | None = None,  # an fp8 cache's path to the dots (FP8_DOT_MODES; None: default_fp8_dot)
    block_m: int = 16,  # query rows of a tile (block_m_for's ``rows``); the tiles: query_tiles of its BLOCK_Q
    causal: bool = True,  # False: every query token sees all its sequence's keys (a cascade's prefix call)
    parts: tuple[torch.Tensor, torch.Tensor] | None = None,  # partial_results buffers the caller merges
    part_base: int = 0,  # first slot of ``parts`` this call writes
    fold: bool = False,  # ``parts`` holds an earlier call's partial results: fold them in, write ``out``
) -> torch.Tensor:
    """Causal paged attention of the given query tiles. ``num_splits > 1`` splits each tile's KV tiles
    across programs and merges the partial results (meant for decode tiles).

    ``parts`` (``triton_merge_splits.partial_results`` of S slots): the call writes each split's partial result
    to slots ``part_base .. part_base + num_splits - 1`` (``num_splits`` a power of two) and merges nothing; the
    caller merges all S slots (``merge_splits``) once every call that fills them has run: cascade attention's
    prefix and suffix calls (``attention/cascade.py``). ``fold`` (one split): ``parts`` holds an earlier call's
    partial results (all its S slots), which the call folds into its own before it writes ``out``: the
    cascade's suffix call merges the prefix call's slots itself, and no merge kernel runs.

    The KV is walked in tiles of ``pages_per_tile`` pages (a power of two; None: ``default_pages_per_tile``
    for the page size, head size and element sizes; 1: the page-at-a-time loop of the first version, for
    comparisons).

    ``rope``: the tiles are decode tiles (one new token each) and the kernel first applies RoPE (+ q/k norm)
    to ``query`` and ``rope.key`` in place and writes the keys and values to the cache, with the bits of
    ``rotary_embedding_kv_write`` (:class:`DecodeRope`); needs ``num_splits == 1`` and 4 warps.
    ``decode``: the tiles are ``query_tiles`` of requests ``0 .. num_tiles - 1`` with one query token each (the
    decode requests come first in a step); the kernel then takes tile i as request i and token i without
    loading ``tile_seq``, ``tile_start`` and ``query_start_loc`` (``DECODE_DIRECT`` off: it loads them anyway).
    ``block_m``: rows of a query tile, ``block_m_for(num_qpkv, block_m)``; the engine's 16 suits decode, and a
    prefill tile of more rows loads each KV tile for more query tokens (``benchmarks/gpu/bench_triton_prefill.py``
    compares them; the tiles must be ``query_tiles`` of that BLOCK_Q).
    The kernel is compiled without FP contraction, with or without ``rope``, so that both give the same bits."""
    num_tokens, num_heads, head = query.shape
    num_kv_heads, page = key_cache.shape[2], key_cache.shape[1]
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1 and query.stride(-1) == 1
    num_qpkv = num_heads // num_kv_heads
    block_m, block_q = block_m_for(num_qpkv, block_m)
    head_pad = padded_head_size(head)
    if pages_per_tile is None:
        elem_bytes = max(query.element_size(), key_cache.element_size())
        pages_per_tile = default_pages_per_tile(page, head_pad, elem_bytes, kv_elem_bytes=key_cache.element_size())
    assert pages_per_tile >= 1 and pages_per_tile & (pages_per_tile - 1) == 0, pages_per_tile
    num_tiles = tile_seq.numel()
    if num_tiles == 0:
        return out
    kv_fp8 = key_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    fp8_dot = (fp8_dot or default_fp8_dot(query.dtype)) if kv_fp8 else "scaled"
    assert fp8_dot in FP8_DOT_MODES, fp8_dot
    prec = "ieee" if query.dtype == torch.float32 else None  # None: the default for 16-bit inputs
    part_out = part_lse = out  # unused placeholders when not splitting
    if num_splits > 1:
        num_splits = next_power_of_2(num_splits)
    fold_slots = 0
    if fold:
        assert parts is not None and num_splits == 1, (num_splits, parts is None)
        part_out, part_lse = parts
        fold_slots, slots = part_lse.shape[-1], 0
    elif parts is not None:
        part_out, part_lse = parts
        slots = part_lse.shape[-1]
        assert num_splits & (num_splits - 1) == 0 and part_base + num_splits <= slots, (num_splits, part_base, slots)
    elif num_splits > 1:
        slots = num_splits
        part_out, part_lse = partial_results(num_tokens, num_heads, num_splits, head_pad, query.device)
    else:
        slots = 0  # the kernel writes ``out``
    rope_args, rope_meta = _rope_arguments(rope, query, (key_cache, value_cache, k_scale, v_scale), num_splits, launch)
    _paged_attention_kernel[(num_tiles, num_kv_heads, num_splits)](
        (out, out.stride(0), out.stride(1)),
        (query, query.stride(0), query.stride(1)),
        (key_cache, *key_cache.stride()[:3], k_scale),
        (value_cache, *value_cache.stride()[:3], v_scale),
        (block_table, block_table.stride(0)),
        (seq_lens, query_start_loc, tile_seq, tile_start),
        (part_out, part_lse),
        sinks if sinks is not None else out,
        (scale, logits_soft_cap or 0.0, sliding_window or 0),
        num_heads,
        rope_args,
        NUM_QPKV=num_qpkv,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        HEAD=head,
        HEAD_PAD=head_pad,
        PAGE=page,
        PAGES_PER_TILE=pages_per_tile,
        NUM_SPLITS=num_splits,
        USE_SOFTCAP=logits_soft_cap is not None,
        USE_WINDOW=sliding_window is not None,
        KV_FP8=kv_fp8,
        FP8_DOT=fp8_dot,
        PREC=prec,
        DECODE=decode and DECODE_DIRECT,
        ORDERED=ordered and decode and DECODE_DIRECT,
        USE_SINKS=sinks is not None,
        CAUSAL=causal,
        PART_SLOTS=slots,
        PART_BASE=part_base,
        FIRST_STAGE=first_stage(block_m, sliding_window is not None),
        FOLD_SLOTS=fold_slots,
        INTERPRET=INTERPRETED,
        **rope_meta,
        **LAUNCH_OPTIONS,
        **pdl.launch(query),
        **(launch or {}),
    )
    if num_splits > 1 and parts is None:
        merge_splits(out, part_out, part_lse, split_token_range or (0, num_tokens), head)
    return out
