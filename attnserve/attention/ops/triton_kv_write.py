"""``reshape_and_cache`` as a Triton kernel: one program per token writes its K and V (all heads).

The cache views may have any strides (NHD or HND order, ``(2, N, ...)`` or ``(N, 2, ...)`` shapes); an fp8
cache gets ``x / scale`` saturated to the format's range. Importing this module imports Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    k_scale, v_scale, fmax,
    NUM_HEADS: tl.constexpr, HEAD: tl.constexpr, H_PAD: tl.constexpr, D_PAD: tl.constexpr,
    PAGE: tl.constexpr, FP8: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok)
    if slot < 0:
        return
    blk = slot // PAGE
    off = slot % PAGE
    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, D_PAD)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD)
    k = tl.load(key_ptr + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    if FP8:
        k = tl.clamp(k.to(tl.float32) / k_scale, -fmax, fmax)
        v = tl.clamp(v.to(tl.float32) / v_scale, -fmax, fmax)
    tl.store(kc_ptr + blk * stride_kcb + off * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :],
             k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + blk * stride_vcb + off * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :],
             v.to(vc_ptr.dtype.element_ty), mask=mask)


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
    fp8 = key_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    fmax = torch.finfo(key_cache.dtype).max if fp8 else 0.0
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        k_scale, v_scale, fmax,
        NUM_HEADS=num_heads, HEAD=head, H_PAD=triton.next_power_of_2(num_heads),
        D_PAD=triton.next_power_of_2(head), PAGE=key_cache.shape[1], FP8=fp8,
    )
