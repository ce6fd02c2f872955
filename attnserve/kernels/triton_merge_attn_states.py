"""Triton kernel of :func:`attnserve.kernels.merge_attn_states.merge_attn_states`: one program per (token,
head) loads the two parts' log-sum-exp and D-element outputs, weighs them in float32 and stores the merge.
Shapes: ``o_a``, ``o_b``, ``out`` (T, H, D), last dim contiguous; ``lse_a``, ``lse_b`` (H, T) float32 (any
strides). No host sync: safe inside a CUDA graph."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_kernel(
    out_ptr,
    oa_ptr,
    ob_ptr,
    lsea_ptr,
    lseb_ptr,
    stride_ot,
    stride_oh,
    stride_at,
    stride_ah,
    stride_bt,
    stride_bh,
    stride_la_h,
    stride_la_t,
    stride_lb_h,
    stride_lb_t,
    head_size,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    la = tl.load(lsea_ptr + h * stride_la_h + t * stride_la_t).to(tl.float32)
    lb = tl.load(lseb_ptr + h * stride_lb_h + t * stride_lb_t).to(tl.float32)
    m = tl.maximum(la, lb)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(la - m)
    wb = tl.exp(lb - m)
    total = tl.maximum(wa + wb, 1.1754943508222875e-38)
    d = tl.arange(0, BLOCK_D)
    mask = d < head_size
    a = tl.load(oa_ptr + t * stride_at + h * stride_ah + d, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(ob_ptr + t * stride_bt + h * stride_bh + d, mask=mask, other=0.0).to(tl.float32)
    merged = a * (wa / total) + b * (wb / total)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, merged.to(out_ptr.dtype.element_ty), mask=mask)


def merge_attn_states(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """See :func:`attnserve.kernels.merge_attn_states.merge_attn_states`."""
    num_tokens, num_heads, head_size = o_a.shape
    if out is None:
        out = torch.empty_like(o_a)
    if num_tokens == 0:
        return out
    _merge_kernel[(num_tokens, num_heads)](
        out,
        o_a,
        o_b,
        lse_a,
        lse_b,
        out.stride(0),
        out.stride(1),
        o_a.stride(0),
        o_a.stride(1),
        o_b.stride(0),
        o_b.stride(1),
        lse_a.stride(0),
        lse_a.stride(1),
        lse_b.stride(0),
        lse_b.stride(1),
        head_size,
        BLOCK_D=triton.next_power_of_2(head_size),
    )
    return out
