"""Triton kernels for RoPE on q and k (+ Qwen3's per-head q/k RMSNorm first), alone or with the paged-KV-cache
write of k and v in the same kernel, and that work for one token and KV head inside another kernel (TRITON_ATTN's
decode attention: :func:`decode_rope_kv_write`). ``fused_ops.rotary_embedding`` / ``rotary_embedding_kv_write``
reach them through ``triton_fused_ops``. Numerics as ``triton_common``'s docstring says. Importing this module
imports Triton.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from attnserve.kernels import pdl
from attnserve.kernels.triton_common import INTERPRETED, LAUNCH_OPTIONS, libdevice_rsqrt, pdl_wait, round_rne
from attnserve.kernels.triton_kv_write import cache_fp8_max, cache_slot_address, cache_value

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.kernels.kv_write import KVWriteTarget


# ------------------------------------------------------------------------------------ RoPE (+ q/k norm)
@triton.jit
def _rope_heads(
    ptr,
    stride_h,
    w_ptr,
    eps,
    cos,
    sin,
    NUM_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    INTERPRET: tl.constexpr,
    store_lo,
    store_hi,
):
    """Rotates (after RMS-normalizing, with HAS_NORM) the NUM_HEADS heads of one token at ``ptr``; stores heads
    [store_lo, store_hi) back in place. ``cos``/``sin``: (1, HALF_PAD) float32. Returns the
    two halves, (HEADS_PAD, HALF_PAD) each in the tensor's dtype (dimensions [0, HALF) and [HALF, 2 HALF) of
    each head). Each head's result depends on that head alone: a caller that stores a subset may load heads
    another program has already rotated, as long as it never stores them."""
    dtype = ptr.dtype.element_ty
    offs_h = tl.arange(0, HEADS_PAD)[:, None]
    offs_d = tl.arange(0, HALF_PAD)[None, :]
    mask = (offs_h < NUM_HEADS) & (offs_d < HALF)
    p1 = ptr + offs_h * stride_h + offs_d
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        mean_sq = tl.math.div_rn(tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1), tl.full((), 2 * HALF, tl.float32))
        inv = libdevice_rsqrt(mean_sq + eps, INTERPRET)[:, None]
        w1 = tl.load(w_ptr + offs_d, mask=offs_d < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs_d, mask=offs_d < HALF, other=0.0).to(tl.float32)
        x1 = w1 * round_rne(x1 * inv, dtype, INTERPRET).to(tl.float32)
        x2 = w2 * round_rne(x2 * inv, dtype, INTERPRET).to(tl.float32)
        if ROUND_NORM:  # the norm's output dtype is the tensor's (not float32, as with a float32 weight)
            x1 = round_rne(x1, dtype, INTERPRET).to(tl.float32)
            x2 = round_rne(x2, dtype, INTERPRET).to(tl.float32)
    y1 = round_rne(x1 * cos - x2 * sin, dtype, INTERPRET)
    y2 = round_rne(x2 * cos + x1 * sin, dtype, INTERPRET)
    store = mask & (offs_h >= store_lo) & (offs_h < store_hi)
    tl.store(p1, y1, mask=store)
    tl.store(p1 + HALF, y2, mask=store)
    return y1, y2


@triton.jit
def _token_cos_sin(pos_ptr, tok, cos_ptr, sin_ptr, stride_cos, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """Token ``tok``'s position's cos and sin rows, (1, HALF_PAD) float32 each (0 past HALF), and the
    (1, HALF_PAD) dimension offsets they were loaded at."""
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_d = tl.arange(0, HALF_PAD)[None, :]
    cos = tl.load(cos_ptr + pos * stride_cos + offs_d, mask=offs_d < HALF, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_cos + offs_d, mask=offs_d < HALF, other=0.0)
    return cos, sin, offs_d


@triton.jit
def _rotary_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    qw_ptr,
    kw_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    q_eps,
    k_eps,
    HQ: tl.constexpr,
    HQ_PAD: tl.constexpr,
    HK: tl.constexpr,
    HK_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ROUND_Q: tl.constexpr,
    ROUND_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program per token: all its query heads, then all its key heads."""
    tok = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)
    cos, sin, offs_d = _token_cos_sin(pos_ptr, tok, cos_ptr, sin_ptr, stride_cos, HALF, HALF_PAD)
    _rope_heads(
        q_ptr + tok * stride_qt,
        stride_qh,
        qw_ptr,
        q_eps,
        cos,
        sin,
        HQ,
        HQ_PAD,
        HALF,
        HALF_PAD,
        HAS_NORM,
        ROUND_Q,
        INTERPRET,
        0,
        HQ,
    )
    _rope_heads(
        k_ptr + tok * stride_kt,
        stride_kh,
        kw_ptr,
        k_eps,
        cos,
        sin,
        HK,
        HK_PAD,
        HALF,
        HALF_PAD,
        HAS_NORM,
        ROUND_K,
        INTERPRET,
        0,
        HK,
    )


def rope_launch(
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    q_norm: tuple[torch.Tensor, float] | None,
    k_norm: tuple[torch.Tensor, float] | None,
) -> tuple[tuple[torch.Tensor, torch.Tensor, float, float], dict]:
    """The checks and the arguments both RoPE kernels share: ``((q weight, k weight, q eps, k eps),
    constexprs and launch options)``. Both launch with the same tile shapes and warps, so the q/k norm's
    float32 sums run in the same order in both (equal bits)."""
    num_tokens, hq, d = query.shape
    hk = key.shape[1]
    assert d % 2 == 0 and key.shape == (num_tokens, hk, d) and key.dtype == query.dtype
    assert query.stride(-1) == 1 and key.stride(-1) == 1
    assert cos_cache.shape[-1] == d // 2 and cos_cache.stride() == sin_cache.stride() and cos_cache.stride(-1) == 1
    assert (q_norm is None) == (k_norm is None), "normalize both q and k heads or neither"
    has_norm = q_norm is not None
    qw, q_eps = q_norm if has_norm else (cos_cache, 0.0)  # unused pointer without norms
    kw, k_eps = k_norm if has_norm else (cos_cache, 0.0)
    if has_norm:
        assert qw.shape == (d,) and kw.shape == (d,) and qw.stride(0) == 1 and kw.stride(0) == 1
    half = d // 2
    meta = dict(
        HQ=hq,
        HQ_PAD=triton.next_power_of_2(hq),
        HK=hk,
        HK_PAD=triton.next_power_of_2(hk),
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        HAS_NORM=has_norm,
        ROUND_Q=has_norm and torch.promote_types(qw.dtype, query.dtype) == query.dtype,
        ROUND_K=has_norm and torch.promote_types(kw.dtype, key.dtype) == key.dtype,
        INTERPRET=INTERPRETED,
        num_warps=4,
        **LAUNCH_OPTIONS,
        **pdl.launch(query),
    )
    return (qw, kw, q_eps, k_eps), meta


def rotary_embedding(
    positions: torch.Tensor,  # (T,) int64
    query: torch.Tensor,  # (T, Hq, D), last dim contiguous
    key: torch.Tensor,  # (T, Hkv, D), last dim contiguous
    cos_cache: torch.Tensor,  # (max_position, D/2) float32, last dim contiguous
    sin_cache: torch.Tensor,
    q_norm: tuple[torch.Tensor, float] | None = None,
    k_norm: tuple[torch.Tensor, float] | None = None,
) -> None:
    """See ``fused_ops.rotary_embedding``."""
    (qw, kw, q_eps, k_eps), meta = rope_launch(query, key, cos_cache, sin_cache, q_norm, k_norm)
    if query.shape[0] == 0:
        return
    _rotary_kernel[(query.shape[0],)](
        positions,
        query,
        key,
        cos_cache,
        sin_cache,
        qw,
        kw,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        cos_cache.stride(0),
        q_eps,
        k_eps,
        **meta,
    )


# ----------------------------------------------------------------- RoPE (+ q/k norm) + KV-cache write
@triton.jit
def _rotary_kv_write_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    qw_ptr,
    kw_ptr,
    slot_ptr,
    kc_ptr,
    vc_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    q_eps,
    k_eps,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    k_scale,
    v_scale,
    fmax,
    HQ: tl.constexpr,
    HQ_PAD: tl.constexpr,
    HK: tl.constexpr,
    HK_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ROUND_Q: tl.constexpr,
    ROUND_K: tl.constexpr,
    PAGE: tl.constexpr,
    FP8: tl.constexpr,
    INTERPRET: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (token, 0): the token's query heads, as ``_rotary_kernel`` rotates them. Program (token, 1):
    its key heads, likewise, then (unless its slot is -1) the rotated keys and the values into the cache
    slot, as ``_reshape_and_cache_kernel`` stores them. q and k run side by side: at decode batch sizes
    there are fewer tokens than SMs, so each token's two halves of the work take two of the idle ones."""
    tok = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)
    cos, sin, offs_d = _token_cos_sin(pos_ptr, tok, cos_ptr, sin_ptr, stride_cos, HALF, HALF_PAD)
    if tl.program_id(1) == 0:
        _rope_heads(
            q_ptr + tok * stride_qt,
            stride_qh,
            qw_ptr,
            q_eps,
            cos,
            sin,
            HQ,
            HQ_PAD,
            HALF,
            HALF_PAD,
            HAS_NORM,
            ROUND_Q,
            INTERPRET,
            0,
            HQ,
        )
    else:
        k1, k2 = _rope_heads(
            k_ptr + tok * stride_kt,
            stride_kh,
            kw_ptr,
            k_eps,
            cos,
            sin,
            HK,
            HK_PAD,
            HALF,
            HALF_PAD,
            HAS_NORM,
            ROUND_K,
            INTERPRET,
            0,
            HK,
        )
        _cache_kv_rows(
            k1,
            k2,
            v_ptr + tok * stride_vt,
            stride_vh,
            tl.load(slot_ptr + tok),
            kc_ptr,
            vc_ptr,
            stride_kcb,
            stride_kcs,
            stride_kch,
            stride_vcb,
            stride_vcs,
            stride_vch,
            k_scale,
            v_scale,
            fmax,
            0,
            HK,
            HK_PAD,
            HALF,
            HALF_PAD,
            PAGE,
            FP8,
        )


@triton.jit
def _cache_kv_rows(
    k1,
    k2,
    v_ptr,
    stride_vh,
    slot,
    kc_ptr,
    vc_ptr,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    k_scale,
    v_scale,
    fmax,
    row_lo,
    row_hi,
    HK_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    FP8: tl.constexpr,
):
    """One token's rotated key heads ``k1``/``k2`` (halves, (HK_PAD, HALF_PAD)) and its value heads at
    ``v_ptr`` into cache slot ``slot`` (nothing when it is -1, a padding token), heads [row_lo, row_hi), as
    ``_reshape_and_cache_kernel`` stores them."""
    if slot >= 0:
        offs_h = tl.arange(0, HK_PAD)[:, None]
        offs_d = tl.arange(0, HALF_PAD)[None, :]
        mask = (offs_h >= row_lo) & (offs_h < row_hi) & (offs_d < HALF)
        kc = cache_slot_address(kc_ptr, slot, stride_kcb, stride_kcs, PAGE) + offs_h * stride_kch + offs_d
        tl.store(kc, cache_value(k1, k_scale, fmax, kc_ptr.dtype.element_ty, FP8), mask=mask)
        tl.store(kc + HALF, cache_value(k2, k_scale, fmax, kc_ptr.dtype.element_ty, FP8), mask=mask)
        v = v_ptr + offs_h * stride_vh + offs_d
        vc = cache_slot_address(vc_ptr, slot, stride_vcb, stride_vcs, PAGE) + offs_h * stride_vch + offs_d
        tl.store(vc, cache_value(tl.load(v, mask=mask), v_scale, fmax, vc_ptr.dtype.element_ty, FP8), mask=mask)
        tl.store(
            vc + HALF, cache_value(tl.load(v + HALF, mask=mask), v_scale, fmax, vc_ptr.dtype.element_ty, FP8), mask=mask
        )


@triton.jit
def decode_rope_kv_write(
    tok,
    kvh,
    pos_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    qw_ptr,
    kw_ptr,
    slot_ptr,
    kc_ptr,
    vc_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    q_eps,
    k_eps,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    k_scale,
    v_scale,
    fmax,
    HQ: tl.constexpr,
    HQ_PAD: tl.constexpr,
    HK: tl.constexpr,
    HK_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ROUND_Q: tl.constexpr,
    ROUND_K: tl.constexpr,
    PAGE: tl.constexpr,
    FP8: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """``_rotary_kv_write_kernel``'s work for token ``tok``, KV head ``kvh`` only, inside another kernel (a
    paged-attention program that owns that token and KV head: ``kernels/triton_attention.py``): its
    ``HQ // HK`` query heads rotated in place, its key head rotated in place and, with its value head, stored
    in the cache. Every head of the token is loaded and computed on the same (HQ_PAD / HK_PAD, HALF_PAD)
    tiles as that kernel's, so the q/k norm's sums add in the same order (the same bits; compiled, like it,
    without FP contraction), and only this KV head's rows are stored: the other KV heads' programs store theirs."""
    cos, sin, offs_d = _token_cos_sin(pos_ptr, tok, cos_ptr, sin_ptr, stride_cos, HALF, HALF_PAD)
    qpkv = HQ // HK
    _rope_heads(
        q_ptr + tok * stride_qt,
        stride_qh,
        qw_ptr,
        q_eps,
        cos,
        sin,
        HQ,
        HQ_PAD,
        HALF,
        HALF_PAD,
        HAS_NORM,
        ROUND_Q,
        INTERPRET,
        kvh * qpkv,
        kvh * qpkv + qpkv,
    )
    k1, k2 = _rope_heads(
        k_ptr + tok * stride_kt,
        stride_kh,
        kw_ptr,
        k_eps,
        cos,
        sin,
        HK,
        HK_PAD,
        HALF,
        HALF_PAD,
        HAS_NORM,
        ROUND_K,
        INTERPRET,
        kvh,
        kvh + 1,
    )
    _cache_kv_rows(
        k1,
        k2,
        v_ptr + tok * stride_vt,
        stride_vh,
        tl.load(slot_ptr + tok),
        kc_ptr,
        vc_ptr,
        stride_kcb,
        stride_kcs,
        stride_kch,
        stride_vcb,
        stride_vcs,
        stride_vch,
        k_scale,
        v_scale,
        fmax,
        kvh,
        kvh + 1,
        HK_PAD,
        HALF,
        HALF_PAD,
        PAGE,
        FP8,
    )


def rotary_embedding_kv_write(
    positions: torch.Tensor,  # (T,) int64
    query: torch.Tensor,  # (T, Hq, D), last dim contiguous
    key: torch.Tensor,  # (T, Hkv, D), last dim contiguous
    value: torch.Tensor,  # (T, Hkv, D), last dim contiguous
    cos_cache: torch.Tensor,  # (max_position, D/2) float32, last dim contiguous
    sin_cache: torch.Tensor,
    target: "KVWriteTarget",
    q_norm: tuple[torch.Tensor, float] | None = None,
    k_norm: tuple[torch.Tensor, float] | None = None,
) -> None:
    """See ``fused_ops.rotary_embedding_kv_write``."""
    (qw, kw, q_eps, k_eps), meta = rope_launch(query, key, cos_cache, sin_cache, q_norm, k_norm)
    kc, vc, slots = target.key_cache, target.value_cache, target.slot_mapping
    num_tokens, hk, d = key.shape
    assert value.shape == key.shape and value.dtype == key.dtype and value.stride(-1) == 1
    assert kc.shape[2:] == (hk, d) and vc.shape == kc.shape and kc.dtype == vc.dtype
    assert kc.stride(-1) == 1 and vc.stride(-1) == 1
    assert slots.shape == (num_tokens,) and slots.dtype == torch.int64
    if num_tokens == 0:
        return
    fp8, fmax = cache_fp8_max(kc)
    _rotary_kv_write_kernel[(num_tokens, 2)](
        positions,
        query,
        key,
        value,
        cos_cache,
        sin_cache,
        qw,
        kw,
        slots,
        kc,
        vc,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        cos_cache.stride(0),
        q_eps,
        k_eps,
        kc.stride(0),
        kc.stride(1),
        kc.stride(2),
        vc.stride(0),
        vc.stride(1),
        vc.stride(2),
        target.k_scale,
        target.v_scale,
        fmax,
        PAGE=kc.shape[1],
        FP8=fp8,
        **meta,
    )
