"""Triton kernels for ``fused_ops.py``: RMSNorm (+ residual add), RoPE on q and k (+ Qwen3's q/k norm, + the
paged-KV-cache write of k and v), SwiGLU. Importing this module imports Triton; ``fused_ops`` imports it on
the first CUDA call.

Numerics: every kernel loads its inputs, computes in float32 and rounds to the storage dtype exactly where
the PyTorch definition in ``fused_ops.py`` rounds (after each PyTorch op whose output is 16-bit). A
product of two bf16 (or fp16) values is exact in float32, so ``weight * y`` rounded once equals PyTorch's
16-bit multiply. Three choices keep the kernels on PyTorch's CUDA rounding:

- floating-point contraction is off (``enable_fp_fusion=False``): ``x1 * cos - x2 * sin`` is two rounded
  products and a rounded difference, as in PyTorch's separate elementwise kernels, not an FMA;
- divisions are IEEE (``div_rn``; Triton's ``/`` on float32 is the 2-ulp ``div.full``), and ``exp`` and
  ``rsqrt`` are libdevice's, the functions nvcc compiles ``expf``/``rsqrtf`` in PyTorch's kernels to;
- the RMSNorm statistic ``mean(x^2)`` is a float32 sum in another order than PyTorch's reduction, so it
  may differ in the last float32 bit, which flips the rounding of a 16-bit output in rare elements (by 1
  ulp). That is the only difference from the PyTorch path.

Under the Triton interpreter (``TRITON_INTERPRET=1``: the kernels run on CPU tensors, for tests)
libdevice is unavailable, so ``exp``/``rsqrt`` are numpy's, and the interpreter's float32 -> bfloat16
cast does not round to nearest even, so :func:`_round` does that rounding with integer ops there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from attnserve.attention.ops.triton_kv_write import _cache_value, _slot_ptr, cache_fp8_max
from attnserve.layers import pdl

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.ops.kv_write import KVWriteTarget

_INTERPRET = bool(triton.knobs.runtime.interpret)
# no FMA contraction (see the module docstring)
_LAUNCH = dict(enable_fp_fusion=False)


@triton.jit
def _round(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 ``x`` rounded to nearest (ties to even) in ``dtype``."""
    if INTERPRET and dtype == tl.bfloat16:  # the interpreter's cast truncates; round in the bits
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """Steps 2 and 3 of ``layers/pdl.py``'s protocol in a kernel launched with ``launch_pdl``: wait for the
    kernels before it, then let the next one start. A no-op without PDL."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _rsqrt(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.rsqrt(x)
    else:
        return libdevice.rsqrt(x)


@triton.jit
def _exp(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        return tl.exp(x)
    else:
        return libdevice.exp(x)


# ---------------------------------------------------------------------------------------------- RMSNorm
@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr,
    stride_x, stride_res, stride_out, stride_sum, eps,
    H: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INTERPRET: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program per row. ``sum_ptr``: where ``x + residual`` goes (and its dtype is the dtype the
    normalized row is rounded to before the weight; without a residual it is ``x_ptr``, never written)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < H
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # a weight: before PDL's wait
    pdl_wait(USE_PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + offs, mask=mask, other=0.0).to(tl.float32)
        s = _round(x + r, sum_ptr.dtype.element_ty, INTERPRET)
        tl.store(sum_ptr + row * stride_sum + offs, s, mask=mask)
        x = s.to(tl.float32)
    mean_sq = tl.math.div_rn(tl.sum(x * x, axis=0), tl.full((), H, tl.float32))
    y = _round(x * _rsqrt(mean_sq + eps, INTERPRET), sum_ptr.dtype.element_ty, INTERPRET).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, _round(w * y, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as (N, H) rows with a contiguous last dim (a view when its strides allow, else a copy)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:  # leading dims that do not merge (e.g. heads of a fused qkv output)
        return x.reshape(-1, x.shape[-1])


def rms_norm(
    x: torch.Tensor,  # (..., H)
    weight: torch.Tensor,  # (H,), contiguous
    eps: float,
    residual: torch.Tensor | None = None,  # (..., H)
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """See ``fused_ops.rms_norm``."""
    H = x.shape[-1]
    assert weight.shape == (H,) and weight.stride(0) == 1
    x2 = _rows(x)
    if residual is not None:
        assert residual.shape == x.shape
        r2 = _rows(residual)
        s = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
        s2 = s.view(-1, H)
    else:
        r2 = s2 = x2  # unused pointers; s2's dtype is the normalized row's dtype
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, s2.dtype), device=x.device)
    out2 = out.view(-1, H)
    if x2.shape[0]:
        block = triton.next_power_of_2(H)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, out2, s2,
            x2.stride(0), r2.stride(0), out2.stride(0), s2.stride(0), eps,
            H=H, BLOCK=block, HAS_RESIDUAL=residual is not None, INTERPRET=_INTERPRET,
            num_warps=min(max(block // 256, 1), 16), **_LAUNCH, **pdl.launch(x2),
        )
    return out if residual is None else (out, s)


# ------------------------------------------------------------------------------------ RoPE (+ q/k norm)
@triton.jit
def _rope_heads(
    ptr, stride_h, w_ptr, eps, cos, sin,
    NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr, ROUND_NORM: tl.constexpr, INTERPRET: tl.constexpr, store_lo, store_hi,
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
        inv = _rsqrt(mean_sq + eps, INTERPRET)[:, None]
        w1 = tl.load(w_ptr + offs_d, mask=offs_d < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs_d, mask=offs_d < HALF, other=0.0).to(tl.float32)
        x1 = w1 * _round(x1 * inv, dtype, INTERPRET).to(tl.float32)
        x2 = w2 * _round(x2 * inv, dtype, INTERPRET).to(tl.float32)
        if ROUND_NORM:  # the norm's output dtype is the tensor's (not float32, as with a float32 weight)
            x1 = _round(x1, dtype, INTERPRET).to(tl.float32)
            x2 = _round(x2, dtype, INTERPRET).to(tl.float32)
    y1 = _round(x1 * cos - x2 * sin, dtype, INTERPRET)
    y2 = _round(x2 * cos + x1 * sin, dtype, INTERPRET)
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
    pos_ptr, q_ptr, k_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, q_eps, k_eps,
    HQ: tl.constexpr, HQ_PAD: tl.constexpr, HK: tl.constexpr, HK_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr, ROUND_Q: tl.constexpr, ROUND_K: tl.constexpr, INTERPRET: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program per token: all its query heads, then all its key heads."""
    tok = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)
    cos, sin, offs_d = _token_cos_sin(pos_ptr, tok, cos_ptr, sin_ptr, stride_cos, HALF, HALF_PAD)
    _rope_heads(q_ptr + tok * stride_qt, stride_qh, qw_ptr, q_eps, cos, sin,
                HQ, HQ_PAD, HALF, HALF_PAD, HAS_NORM, ROUND_Q, INTERPRET, 0, HQ)
    _rope_heads(k_ptr + tok * stride_kt, stride_kh, kw_ptr, k_eps, cos, sin,
                HK, HK_PAD, HALF, HALF_PAD, HAS_NORM, ROUND_K, INTERPRET, 0, HK)


def _rope_launch(
    query: torch.Tensor, key: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
    q_norm: tuple[torch.Tensor, float] | None, k_norm: tuple[torch.Tensor, float] | None,
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
        HQ=hq, HQ_PAD=triton.next_power_of_2(hq), HK=hk, HK_PAD=triton.next_power_of_2(hk),
        HALF=half, HALF_PAD=triton.next_power_of_2(half), HAS_NORM=has_norm,
        ROUND_Q=has_norm and torch.promote_types(qw.dtype, query.dtype) == query.dtype,
        ROUND_K=has_norm and torch.promote_types(kw.dtype, key.dtype) == key.dtype,
        INTERPRET=_INTERPRET, num_warps=4, **_LAUNCH, **pdl.launch(query),
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
    (qw, kw, q_eps, k_eps), meta = _rope_launch(query, key, cos_cache, sin_cache, q_norm, k_norm)
    if query.shape[0] == 0:
        return
    _rotary_kernel[(query.shape[0],)](
        positions, query, key, cos_cache, sin_cache, qw, kw,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_cache.stride(0), q_eps, k_eps, **meta,
    )


# ----------------------------------------------------------------- RoPE (+ q/k norm) + KV-cache write
@triton.jit
def _rotary_kv_write_kernel(
    pos_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, slot_ptr, kc_ptr, vc_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, q_eps, k_eps,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, k_scale, v_scale, fmax,
    HQ: tl.constexpr, HQ_PAD: tl.constexpr, HK: tl.constexpr, HK_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr, ROUND_Q: tl.constexpr, ROUND_K: tl.constexpr,
    PAGE: tl.constexpr, FP8: tl.constexpr, INTERPRET: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Program (token, 0): the token's query heads, as ``_rotary_kernel`` rotates them. Program (token, 1):
    its key heads, likewise, then (unless its slot is -1) the rotated keys and the values into the cache
    slot, as ``_reshape_and_cache_kernel`` stores them. q and k run side by side: at decode batch sizes
    there are fewer tokens than SMs, so each token's two halves of the work take two of the idle ones."""
    tok = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)
    cos, sin, offs_d = _token_cos_sin(pos_ptr, tok, cos_ptr, sin_ptr, stride_cos, HALF, HALF_PAD)
    if tl.program_id(1) == 0:
        _rope_heads(q_ptr + tok * stride_qt, stride_qh, qw_ptr, q_eps, cos, sin,
                    HQ, HQ_PAD, HALF, HALF_PAD, HAS_NORM, ROUND_Q, INTERPRET, 0, HQ)
    else:
        k1, k2 = _rope_heads(k_ptr + tok * stride_kt, stride_kh, kw_ptr, k_eps, cos, sin,
                             HK, HK_PAD, HALF, HALF_PAD, HAS_NORM, ROUND_K, INTERPRET, 0, HK)
        _cache_kv_rows(k1, k2, v_ptr + tok * stride_vt, stride_vh, tl.load(slot_ptr + tok), kc_ptr, vc_ptr,
                       stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, k_scale, v_scale, fmax,
                       0, HK, HK_PAD, HALF, HALF_PAD, PAGE, FP8)


@triton.jit
def _cache_kv_rows(k1, k2, v_ptr, stride_vh, slot, kc_ptr, vc_ptr,
                   stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, k_scale, v_scale, fmax,
                   row_lo, row_hi, HK_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                   PAGE: tl.constexpr, FP8: tl.constexpr):
    """One token's rotated key heads ``k1``/``k2`` (halves, (HK_PAD, HALF_PAD)) and its value heads at
    ``v_ptr`` into cache slot ``slot`` (nothing when it is -1, a padding token), heads [row_lo, row_hi), as
    ``_reshape_and_cache_kernel`` stores them."""
    if slot >= 0:
        offs_h = tl.arange(0, HK_PAD)[:, None]
        offs_d = tl.arange(0, HALF_PAD)[None, :]
        mask = (offs_h >= row_lo) & (offs_h < row_hi) & (offs_d < HALF)
        kc = _slot_ptr(kc_ptr, slot, stride_kcb, stride_kcs, PAGE) + offs_h * stride_kch + offs_d
        tl.store(kc, _cache_value(k1, k_scale, fmax, kc_ptr.dtype.element_ty, FP8), mask=mask)
        tl.store(kc + HALF, _cache_value(k2, k_scale, fmax, kc_ptr.dtype.element_ty, FP8), mask=mask)
        v = v_ptr + offs_h * stride_vh + offs_d
        vc = _slot_ptr(vc_ptr, slot, stride_vcb, stride_vcs, PAGE) + offs_h * stride_vch + offs_d
        tl.store(vc, _cache_value(tl.load(v, mask=mask), v_scale, fmax, vc_ptr.dtype.element_ty, FP8), mask=mask)
        tl.store(vc + HALF, _cache_value(tl.load(v + HALF, mask=mask), v_scale, fmax, vc_ptr.dtype.element_ty, FP8),
                 mask=mask)


@triton.jit
def decode_rope_kv_write(
    tok, kvh, pos_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, slot_ptr, kc_ptr, vc_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, q_eps, k_eps,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, k_scale, v_scale, fmax,
    HQ: tl.constexpr, HQ_PAD: tl.constexpr, HK: tl.constexpr, HK_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr, ROUND_Q: tl.constexpr, ROUND_K: tl.constexpr,
    PAGE: tl.constexpr, FP8: tl.constexpr, INTERPRET: tl.constexpr,
):
    """``_rotary_kv_write_kernel``'s work for token ``tok``, KV head ``kvh`` only, inside another kernel (a
    paged-attention program that owns that token and KV head: ``attention/ops/triton_attention.py``): its
    ``HQ // HK`` query heads rotated in place, its key head rotated in place and, with its value head, stored
    in the cache. Every head of the token is loaded and computed on the same (HQ_PAD / HK_PAD, HALF_PAD)
    tiles as that kernel's, so the q/k norm's sums add in the same order (the same bits; compiled, like it,
    without FP contraction), and only this KV head's rows are stored: the other KV heads' programs store theirs."""
    cos, sin, offs_d = _token_cos_sin(pos_ptr, tok, cos_ptr, sin_ptr, stride_cos, HALF, HALF_PAD)
    qpkv = HQ // HK
    _rope_heads(q_ptr + tok * stride_qt, stride_qh, qw_ptr, q_eps, cos, sin,
                HQ, HQ_PAD, HALF, HALF_PAD, HAS_NORM, ROUND_Q, INTERPRET, kvh * qpkv, kvh * qpkv + qpkv)
    k1, k2 = _rope_heads(k_ptr + tok * stride_kt, stride_kh, kw_ptr, k_eps, cos, sin,
                         HK, HK_PAD, HALF, HALF_PAD, HAS_NORM, ROUND_K, INTERPRET, kvh, kvh + 1)
    _cache_kv_rows(k1, k2, v_ptr + tok * stride_vt, stride_vh, tl.load(slot_ptr + tok), kc_ptr, vc_ptr,
                   stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, k_scale, v_scale, fmax,
                   kvh, kvh + 1, HK_PAD, HALF, HALF_PAD, PAGE, FP8)


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
    (qw, kw, q_eps, k_eps), meta = _rope_launch(query, key, cos_cache, sin_cache, q_norm, k_norm)
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
        positions, query, key, value, cos_cache, sin_cache, qw, kw, slots, kc, vc,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cos_cache.stride(0), q_eps, k_eps,
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        target.k_scale, target.v_scale, fmax, PAGE=kc.shape[1], FP8=fp8, **meta,
    )


# ------------------------------------------------------------------------------------------------ SwiGLU
@triton.jit
def _silu_mul(gate, up, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 ``gate`` and ``up`` -> ``silu(gate) * up`` in ``dtype``, rounded after the silu and after the
    product, as PyTorch's two ops round. Shared by :func:`silu_and_mul` and the SwiGLU prologue of
    ``triton_gemv`` (so both give the same bits); a kernel calling it must be compiled without FP contraction
    (``_LAUNCH``): libdevice's ``exp`` ends in a multiply that ``1.0 +`` would otherwise fuse into an FMA."""
    act = _round(tl.math.div_rn(gate, 1.0 + _exp(-gate, INTERPRET)), dtype, INTERPRET).to(tl.float32)
    return _round(act * up, dtype, INTERPRET)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_out,
    INTER: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Program (row, column block): ``out[row, cols] = silu(x[row, cols]) * x[row, INTER + cols]``."""
    row = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, _silu_mul(gate, up, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # (T, 2I) -> (T, I)
    """See ``fused_ops.silu_and_mul``."""
    inter = x.shape[-1] // 2
    x2 = _rows(x)
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(triton.next_power_of_2(inter), 1024)
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            x2, out.view(-1, inter), x2.stride(0), inter,
            INTER=inter, BLOCK=block, INTERPRET=_INTERPRET, num_warps=4, **_LAUNCH, **pdl.launch(x2),
        )
    return out
