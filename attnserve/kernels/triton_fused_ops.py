"""Triton kernels for ``fused_ops.py``: RMSNorm (+ residual add) and SwiGLU here; RoPE on q and k (+ Qwen3's
q/k norm, + the paged-KV-cache write of k and v) in ``triton_rope.py``, whose entry points this module
re-exports, so that ``fused_ops`` dispatches every op through one module. Numerics, and the shared rounding and
PDL helpers: ``triton_common.py``. Importing this module imports Triton; ``fused_ops`` imports it on the first
CUDA call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnserve.kernels import pdl
from attnserve.kernels.triton_common import (
    INTERPRETED,
    LAUNCH_OPTIONS,
    libdevice_exp,
    libdevice_rsqrt,
    pdl_wait,
    round_rne,
)
from attnserve.kernels.triton_rope import rotary_embedding, rotary_embedding_kv_write  # noqa: F401


# ---------------------------------------------------------------------------------------------- RMSNorm
@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    stride_x,
    stride_res,
    stride_out,
    stride_sum,
    eps,
    H: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    INTERPRET: tl.constexpr,
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
        s = round_rne(x + r, sum_ptr.dtype.element_ty, INTERPRET)
        tl.store(sum_ptr + row * stride_sum + offs, s, mask=mask)
        x = s.to(tl.float32)
    mean_sq = tl.math.div_rn(tl.sum(x * x, axis=0), tl.full((), H, tl.float32))
    y = round_rne(x * libdevice_rsqrt(mean_sq + eps, INTERPRET), sum_ptr.dtype.element_ty, INTERPRET).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, round_rne(w * y, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


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
            x2,
            r2,
            weight,
            out2,
            s2,
            x2.stride(0),
            r2.stride(0),
            out2.stride(0),
            s2.stride(0),
            eps,
            H=H,
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            INTERPRET=INTERPRETED,
            num_warps=min(max(block // 256, 1), 16),
            **LAUNCH_OPTIONS,
            **pdl.launch(x2),
        )
    return out if residual is None else (out, s)


# ------------------------------------------------------------------------------------------------ SwiGLU
@triton.jit
def silu_mul(gate, up, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 ``gate`` and ``up`` -> ``silu(gate) * up`` in ``dtype``, rounded after the silu and after the
    product, as PyTorch's two ops round. Shared by :func:`silu_and_mul` and the SwiGLU prologue of
    ``triton_gemv`` (so both give the same bits); a kernel calling it must be compiled without FP contraction
    (``LAUNCH_OPTIONS``): libdevice's ``exp`` ends in a multiply that ``1.0 +`` would otherwise fuse into an FMA."""
    act = round_rne(tl.math.div_rn(gate, 1.0 + libdevice_exp(-gate, INTERPRET)), dtype, INTERPRET).to(tl.float32)
    return round_rne(act * up, dtype, INTERPRET)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    stride_x,
    stride_out,
    INTER: tl.constexpr,
    BLOCK: tl.constexpr,
    INTERPRET: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Program (row, column block): ``out[row, cols] = silu(x[row, cols]) * x[row, INTER + cols]``."""
    row = tl.program_id(0).to(tl.int64)
    pdl_wait(USE_PDL)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, silu_mul(gate, up, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # (T, 2I) -> (T, I)
    """See ``fused_ops.silu_and_mul``."""
    inter = x.shape[-1] // 2
    x2 = _rows(x)
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(triton.next_power_of_2(inter), 1024)
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            x2,
            out.view(-1, inter),
            x2.stride(0),
            inter,
            INTER=inter,
            BLOCK=block,
            INTERPRET=INTERPRETED,
            num_warps=4,
            **LAUNCH_OPTIONS,
            **pdl.launch(x2),
        )
    return out
