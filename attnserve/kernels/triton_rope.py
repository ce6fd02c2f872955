"""Triton kernels for RoPE on q and k (+ Qwen3's per-head q/k RMSNorm first), alone or with the paged-KV-cache
write of k and v in the same kernel. One ``@triton.jit`` function does one token's work for a range of its KV
heads (:func:`rope_kv_write_token`): ``_rope_kernel`` calls it for whole tokens, TRITON_ATTN's decode kernel
(``triton_attention_kernel.py``) for one token and KV head before it attends. ``fused_ops.rotary_embedding`` /
``rotary_embedding_kv_write`` reach them through ``triton_fused_ops``. Numerics as ``triton_common``'s
docstring says. Importing this module imports Triton.

The arguments travel as one tuple ``(q, k, v, rope, cache)`` (Triton passes a tuple's members as kernel
arguments), which :func:`rope_arguments` makes for every caller:

- ``q``, ``k``, ``v``: ``(ptr, stride_t, stride_h)`` of a (T, H, D) tensor, last dim contiguous (``v``: None
  without the cache write);
- ``rope``: ``(pos_ptr, cos_ptr, sin_ptr, stride_cos, qw_ptr, q_eps, kw_ptr, k_eps)``: each token's position,
  the (max_position, D/2) float32 cos/sin tables, the q/k norms' weights and eps (the cos table and 0.0
  without norms);
- ``cache``: ``(slot_ptr, kc, vc, fmax)``: each token's slot (-1: not stored), the key and the value cache
  views (num_blocks, PAGE, Hkv, D) as ``(ptr, stride_b, stride_s, stride_h, fp8 scale)`` and the fp8 format's
  largest value (0.0 when the cache is not fp8); None without the cache write.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from attnserve.kernels import pdl
from attnserve.kernels.kv_write import KVWriteTarget
from attnserve.kernels.triton_common import INTERPRETED, LAUNCH_OPTIONS, libdevice_rsqrt, pdl_wait, round_rne
from attnserve.kernels.triton_kv_write import cache_fp8_max, cache_slot_address, cache_value


@triton.jit
def _rope_heads(
    x,
    tok,
    cos,
    sin,
    w_ptr,
    eps,
    store_lo,
    store_hi,
    NUM_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Rotates (after RMS-normalizing, with HAS_NORM) the NUM_HEADS heads of token ``tok`` of ``x`` (``(ptr,
    stride_t, stride_h)``); stores heads [store_lo, store_hi) back in place. ``cos``/``sin``: (1, HALF_PAD)
    float32. Returns the two halves, (HEADS_PAD, HALF_PAD) each in the tensor's dtype (dimensions [0, HALF) and
    [HALF, 2 HALF) of each head). Each head's result depends on that head alone: a caller that stores a subset
    may load heads another program has already rotated, as long as it never stores them."""
    ptr, stride_t, stride_h = x
    ptr = ptr + tok * stride_t
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
def _cache_kv_rows(
    k1,
    k2,
    v,
    tok,
    cache,
    row_lo,
    row_hi,
    HK_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    FP8: tl.constexpr,
):
    """Token ``tok``'s rotated key heads ``k1``/``k2`` (halves, (HK_PAD, HALF_PAD)) and its value heads into its
    cache slot (nothing when it is -1, a padding token), heads [row_lo, row_hi), as
    ``_reshape_and_cache_kernel`` stores them."""
    slot_ptr, kc, vc, fmax = cache
    kc_ptr, stride_kcb, stride_kcs, stride_kch, k_scale = kc
    vc_ptr, stride_vcb, stride_vcs, stride_vch, v_scale = vc
    v_ptr, stride_vt, stride_vh = v
    slot = tl.load(slot_ptr + tok)
    if slot >= 0:
        offs_h = tl.arange(0, HK_PAD)[:, None]
        offs_d = tl.arange(0, HALF_PAD)[None, :]
        mask = (offs_h >= row_lo) & (offs_h < row_hi) & (offs_d < HALF)
        k_at = cache_slot_address(kc_ptr, slot, stride_kcb, stride_kcs, PAGE) + offs_h * stride_kch + offs_d
        tl.store(k_at, cache_value(k1, k_scale, fmax, kc_ptr.dtype.element_ty, FP8), mask=mask)
        tl.store(k_at + HALF, cache_value(k2, k_scale, fmax, kc_ptr.dtype.element_ty, FP8), mask=mask)
        v_from = v_ptr + tok * stride_vt + offs_h * stride_vh + offs_d
        v_at = cache_slot_address(vc_ptr, slot, stride_vcb, stride_vcs, PAGE) + offs_h * stride_vch + offs_d
        v1, v2 = tl.load(v_from, mask=mask), tl.load(v_from + HALF, mask=mask)
        tl.store(v_at, cache_value(v1, v_scale, fmax, vc_ptr.dtype.element_ty, FP8), mask=mask)
        tl.store(v_at + HALF, cache_value(v2, v_scale, fmax, vc_ptr.dtype.element_ty, FP8), mask=mask)


@triton.jit
def rope_kv_write_token(
    tok,
    args,
    kv_lo,
    kv_hi,
    do_q,
    do_k,
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
    WRITE_KV: tl.constexpr,
):
    """Token ``tok``'s work for its KV heads [kv_lo, kv_hi) (``args``: the module docstring's tuple): with
    ``do_q`` its ``HQ // HK`` query heads per KV head rotated in place; with ``do_k`` its key heads rotated in
    place and, with WRITE_KV, stored with its value heads at its cache slot. Every head of the token is loaded
    and computed on the same (HQ_PAD / HK_PAD, HALF_PAD) tiles whatever the range, so the q/k norm's sums add in
    the same order for every caller (the same bits; compiled without FP contraction), and only the range's rows
    are stored: a caller that owns one KV head leaves the others to their programs."""
    q, k, v, rope, cache = args
    pos_ptr, cos_ptr, sin_ptr, stride_cos, qw_ptr, q_eps, kw_ptr, k_eps = rope
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_d = tl.arange(0, HALF_PAD)[None, :]
    cos = tl.load(cos_ptr + pos * stride_cos + offs_d, mask=offs_d < HALF, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_cos + offs_d, mask=offs_d < HALF, other=0.0)
    q_lo, q_hi = kv_lo * (HQ // HK), kv_hi * (HQ // HK)
    if do_q:
        _rope_heads(
            q, tok, cos, sin, qw_ptr, q_eps, q_lo, q_hi, HQ, HQ_PAD, HALF, HALF_PAD, HAS_NORM, ROUND_Q, INTERPRET
        )
    if do_k:
        k1, k2 = _rope_heads(
            k, tok, cos, sin, kw_ptr, k_eps, kv_lo, kv_hi, HK, HK_PAD, HALF, HALF_PAD, HAS_NORM, ROUND_K, INTERPRET
        )
        if WRITE_KV:
            _cache_kv_rows(k1, k2, v, tok, cache, kv_lo, kv_hi, HK_PAD, HALF, HALF_PAD, PAGE, FP8)


@triton.jit
def _rope_kernel(
    args,
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
    WRITE_KV: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Without WRITE_KV, program (token,): its query heads, then its key heads. With WRITE_KV, program (token, 0):
    its query heads; program (token, 1): its key heads, then (unless its slot is -1) the rotated keys and the
    values into the cache, as ``_reshape_and_cache_kernel`` stores them. q and k run side by side there: at
    decode batch sizes there are fewer tokens than SMs, so each token's two halves of the work take two of the
    idle ones."""
    tok = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)
    if WRITE_KV:
        do_q = tl.program_id(1) == 0
        do_k = tl.program_id(1) == 1
    else:
        do_q = True
        do_k = True
    rope_kv_write_token(
        tok,
        args,
        0,
        HK,
        do_q,
        do_k,
        HQ,
        HQ_PAD,
        HK,
        HK_PAD,
        HALF,
        HALF_PAD,
        HAS_NORM,
        ROUND_Q,
        ROUND_K,
        PAGE,
        FP8,
        INTERPRET,
        WRITE_KV,
    )


def rope_arguments(
    positions: torch.Tensor,  # (T,) int64
    query: torch.Tensor,  # (T, Hq, D), last dim contiguous
    key: torch.Tensor,  # (T, Hkv, D), last dim contiguous
    cos_cache: torch.Tensor,  # (max_position, D/2) float32, last dim contiguous
    sin_cache: torch.Tensor,
    q_norm: tuple[torch.Tensor, float] | None,
    k_norm: tuple[torch.Tensor, float] | None,
    value: torch.Tensor | None = None,  # (T, Hkv, D), last dim contiguous: with ``target``, the cache write
    target: KVWriteTarget | None = None,
) -> tuple[tuple, dict]:
    """The checks and the arguments of :func:`rope_kv_write_token` for every caller: ``(q, k, v, rope, cache)``
    (the module docstring) and its constexprs with the launch options. Every caller launches it with the same
    tile shapes and warps, so the q/k norm's float32 sums run in the same order in all of them (equal bits)."""
    num_tokens, hq, d = query.shape
    hk = key.shape[1]
    assert hq % hk == 0 and d % 2 == 0 and key.shape == (num_tokens, hk, d) and key.dtype == query.dtype
    assert query.stride(-1) == 1 and key.stride(-1) == 1
    assert cos_cache.shape[-1] == d // 2 and cos_cache.stride() == sin_cache.stride() and cos_cache.stride(-1) == 1
    assert (q_norm is None) == (k_norm is None), "normalize both q and k heads or neither"
    has_norm = q_norm is not None
    qw, q_eps = q_norm if has_norm else (cos_cache, 0.0)  # unused pointer without norms
    kw, k_eps = k_norm if has_norm else (cos_cache, 0.0)
    if has_norm:
        assert qw.shape == (d,) and kw.shape == (d,) and qw.stride(0) == 1 and kw.stride(0) == 1
    rope = (positions, cos_cache, sin_cache, cos_cache.stride(0), qw, q_eps, kw, k_eps)
    v = cache = None
    fp8, page = False, 1
    if target is not None:
        kc, vc, slots = target.key_cache, target.value_cache, target.slot_mapping
        assert value is not None and value.shape == key.shape and value.dtype == key.dtype and value.stride(-1) == 1
        assert kc.shape[2:] == (hk, d) and vc.shape == kc.shape and kc.dtype == vc.dtype
        assert kc.stride(-1) == 1 and vc.stride(-1) == 1
        assert slots.shape == (num_tokens,) and slots.dtype == torch.int64
        fp8, fmax = cache_fp8_max(kc)
        page = kc.shape[1]
        v = (value, value.stride(0), value.stride(1))
        cache = (slots, (kc, *kc.stride()[:3], target.k_scale), (vc, *vc.stride()[:3], target.v_scale), fmax)
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
        PAGE=page,
        FP8=fp8,
        INTERPRET=INTERPRETED,
        WRITE_KV=target is not None,
        num_warps=4,
        **LAUNCH_OPTIONS,
        **pdl.launch(query),
    )
    q = (query, query.stride(0), query.stride(1))
    return (q, (key, key.stride(0), key.stride(1)), v, rope, cache), meta


@dataclass(frozen=True)
class DecodeRope:
    """What :func:`rotary_embedding_kv_write` would take for a decode step's tokens, for
    ``triton_attention.paged_attention`` to do that work inside its kernel (``Attention.forward_with_rope``
    through TRITON_ATTN's ``forward_with_rope``)."""

    positions: torch.Tensor  # (T,) int64
    key: torch.Tensor  # (T, Hkv, D) the new keys, rotated in place; last dim contiguous
    value: torch.Tensor  # (T, Hkv, D) the new values; last dim contiguous
    cos_cache: torch.Tensor  # (max_position, D/2) float32
    sin_cache: torch.Tensor  # (max_position, D/2) float32
    slot_mapping: torch.Tensor  # (T,) int64 cache slot of each token, -1: not stored
    q_norm: tuple[torch.Tensor, float] | None = None  # (weight (D,), eps): RMSNorm of each query head first
    k_norm: tuple[torch.Tensor, float] | None = None

    def arguments(
        self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, k_scale: float, v_scale: float
    ) -> tuple[tuple, dict]:
        """:func:`rope_arguments` of ``query`` and these new tokens, their keys and values written to the caches
        at ``slot_mapping`` (``KVWriteTarget``'s fields)."""
        target = KVWriteTarget(key_cache, value_cache, self.slot_mapping, k_scale, v_scale)
        return rope_arguments(
            self.positions,
            query,
            self.key,
            self.cos_cache,
            self.sin_cache,
            self.q_norm,
            self.k_norm,
            self.value,
            target,
        )


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
    args, meta = rope_arguments(positions, query, key, cos_cache, sin_cache, q_norm, k_norm)
    if query.shape[0]:
        _rope_kernel[(query.shape[0],)](args, **meta)


def rotary_embedding_kv_write(
    positions: torch.Tensor,  # (T,) int64
    query: torch.Tensor,  # (T, Hq, D), last dim contiguous
    key: torch.Tensor,  # (T, Hkv, D), last dim contiguous
    value: torch.Tensor,  # (T, Hkv, D), last dim contiguous
    cos_cache: torch.Tensor,  # (max_position, D/2) float32, last dim contiguous
    sin_cache: torch.Tensor,
    target: KVWriteTarget,
    q_norm: tuple[torch.Tensor, float] | None = None,
    k_norm: tuple[torch.Tensor, float] | None = None,
) -> None:
    """See ``fused_ops.rotary_embedding_kv_write``."""
    args, meta = rope_arguments(positions, query, key, cos_cache, sin_cache, q_norm, k_norm, value, target)
    if query.shape[0]:
        _rope_kernel[(query.shape[0], 2)](args, **meta)
