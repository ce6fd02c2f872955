"""``reshape_and_cache`` (vLLM's ``csrc/cache_kernels.cu``) as a Triton kernel: one program per token writes
its K and V (all heads).

The cache views may have any strides (NHD or HND order, ``(2, N, ...)`` or ``(N, 2, ...)`` shapes); an fp8
cache gets ``x / scale`` saturated to the format's range. The two ``@triton.jit`` helpers (the slot's
address, the value a cache element gets) are shared with the RoPE kernel that writes K/V itself
(``kernels/triton_rope.py``), so both store the same bits. Importing this module imports Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def cache_slot_address(cache_ptr, slot, stride_b, stride_s, PAGE: tl.constexpr):
    """The address of flat cache slot ``slot`` (``block * PAGE + offset``, int64) in a
    ``(num_blocks, PAGE, H, D)`` view with block / in-block strides ``stride_b`` / ``stride_s``."""
    return cache_ptr + (slot // PAGE) * stride_b + (slot % PAGE) * stride_s


@triton.jit
def cache_value(x, scale, fmax, dtype: tl.constexpr, FP8: tl.constexpr):
    """``x`` (a loaded K or V tile, in its storage dtype) as the cache stores it: cast to ``dtype``; in an
    fp8 cache ``x / scale`` saturated to +-``fmax`` first."""
    if FP8:
        x = tl.clamp(x.to(tl.float32) / scale, -fmax, fmax)
    return x.to(dtype)


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    k_scale,
    v_scale,
    fmax,
    NUM_HEADS: tl.constexpr,
    HEAD: tl.constexpr,
    H_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    FP8: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok)
    if slot < 0:
        return
    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, D_PAD)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD)
    k = tl.load(key_ptr + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(
        cache_slot_address(kc_ptr, slot, stride_kcb, stride_kcs, PAGE) + offs_h[:, None] * stride_kch + offs_d[None, :],
        cache_value(k, k_scale, fmax, kc_ptr.dtype.element_ty, FP8),
        mask=mask,
    )
    tl.store(
        cache_slot_address(vc_ptr, slot, stride_vcb, stride_vcs, PAGE) + offs_h[:, None] * stride_vch + offs_d[None, :],
        cache_value(v, v_scale, fmax, vc_ptr.dtype.element_ty, FP8),
        mask=mask,
    )


def cache_fp8_max(key_cache: torch.Tensor) -> tuple[bool, float]:
    """(whether the cache is fp8, the format's largest finite value or 0.0): the kernels' FP8/fmax arguments."""
    fp8 = key_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return fp8, (torch.finfo(key_cache.dtype).max if fp8 else 0.0)


def reshape_and_cache(
    key: torch.Tensor,  # (T, Hkv, D)
    value: torch.Tensor,  # (T, Hkv, D)
    key_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D), last dim contiguous
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64, -1 = skip
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    num_tokens, num_heads, head = key.shape
    if num_tokens == 0:
        return
    assert key.stride(-1) == 1 and value.stride(-1) == 1
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1
    fp8, fmax = cache_fp8_max(key_cache)
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        k_scale,
        v_scale,
        fmax,
        NUM_HEADS=num_heads,
        HEAD=head,
        H_PAD=triton.next_power_of_2(num_heads),
        D_PAD=triton.next_power_of_2(head),
        PAGE=key_cache.shape[1],
        FP8=fp8,
    )
