"""The decoder layer's elementwise and row-wise ops, fused: one kernel launch each instead of 3 to 10.

Each op has two implementations with one contract: a Triton kernel (``triton_fused_ops.py``, RoPE's in
``triton_rope.py``) for CUDA tensors, and the plain-PyTorch math below for every other device (and on CUDA
when Triton is missing).
The PyTorch path is the definition: it is what the layers computed before the kernels existed, so CPU
results are unchanged bit for bit, and the kernels round where it rounds (float32 math, one rounding to
the model dtype after each PyTorch op), so GPU results differ from it only where a float32 sum is added in
another order (the RMSNorm statistic; see ``triton_common.py``).

Launches per Llama decoder layer on CUDA, besides the matmuls and attention: 2 RMSNorms that also add the
residual (vLLM's ``fused_add_rms_norm``), 1 RoPE over q and k (with Qwen3's per-head q/k RMSNorm in the same
pass, and, where the attention backend allows it, the paged-KV-cache write of k and v too), 1 SwiGLU: 4
instead of ~40. Triton is imported on the first call with a CUDA tensor, never by ``import attnserve``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.kernels.kv_write import KVWriteTarget


@dataclass(frozen=True)
class RopeInputs:
    """What RoPE takes besides the query and key heads, as tensors: each token's position, the cos/sin
    tables and, for Qwen3, the per-head q/k RMSNorm's weight and eps. The attention contract
    (``Attention.forward_with_rope``, ``AttentionImpl.forward_with_rope``) passes this record, not the
    model's RotaryEmbedding and RMSNorm modules (``RotaryEmbedding.inputs`` makes it)."""

    positions: torch.Tensor  # (T,) int64
    cos_cache: torch.Tensor  # (max_position, D/2) float32, last dim contiguous
    sin_cache: torch.Tensor  # (max_position, D/2) float32, same strides
    q_norm: tuple[torch.Tensor, float] | None = None  # (weight (D,), eps): RMSNorm each query head first
    k_norm: tuple[torch.Tensor, float] | None = None  # (weight (D,), eps): both norms or neither

    def apply(self, query: torch.Tensor, key: torch.Tensor) -> None:  # (T, Hq, D), (T, Hkv, D)
        """:func:`rotary_embedding` of ``query`` and ``key``, in place."""
        rotary_embedding(self.positions, query, key, self.cos_cache, self.sin_cache, self.q_norm, self.k_norm)

    def apply_kv_write(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, target: "KVWriteTarget"
    ) -> None:
        """:func:`rotary_embedding_kv_write`: :meth:`apply`, and the rotated keys and the values stored in
        ``target``'s paged cache (one kernel on CUDA)."""
        rotary_embedding_kv_write(
            self.positions, query, key, value, self.cos_cache, self.sin_cache, target, self.q_norm, self.k_norm
        )


@functools.cache
def _triton_ops() -> ModuleType | None:
    """``attnserve.kernels.triton_fused_ops``, or None where Triton is not installed."""
    try:
        from attnserve.kernels import triton_fused_ops
    except ImportError:
        return None
    return triton_fused_ops


def _use_triton(x: torch.Tensor) -> ModuleType | None:
    return _triton_ops() if x.is_cuda else None


def rms_norm(
    x: torch.Tensor,  # (..., H) float32 / float16 / bfloat16
    weight: torch.Tensor,  # (H,)
    eps: float,
    residual: torch.Tensor | None = None,  # (..., H), same shape as x
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm (Zhang & Sennrich 2019) with float32 statistics, as Hugging Face Llama computes it:
    ``weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)``.

    Without ``residual``: returns the normalized rows. With ``residual``: first ``s = x + residual`` (rounded
    to their dtype, exactly PyTorch's ``residual + x``), returns ``(norm(s), s)``: vLLM's
    ``fused_add_rms_norm``, so a pre-norm block's residual add costs no launch of its own. Inputs are not
    modified.
    """
    ops = _use_triton(x)
    if ops is not None:
        return ops.rms_norm(x, weight, eps, residual)
    return rms_norm_torch(x, weight, eps, residual)


def rms_norm_torch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch definition of :func:`rms_norm` (any device)."""
    if residual is not None:
        s = x + residual
        return rms_norm_torch(s, weight, eps), s
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rotary_embedding(
    positions: torch.Tensor,  # (T,) int64
    query: torch.Tensor,  # (T, Hq, D), last dim contiguous; may be a view into a fused qkv output
    key: torch.Tensor,  # (T, Hkv, D), same
    cos_cache: torch.Tensor,  # (max_position, D/2) float32
    sin_cache: torch.Tensor,  # (max_position, D/2) float32
    q_norm: tuple[torch.Tensor, float] | None = None,  # (weight (D,), eps): RMSNorm each query head first
    k_norm: tuple[torch.Tensor, float] | None = None,  # (weight (D,), eps): RMSNorm each key head first
) -> None:
    """RoPE (Su et al. 2021), NeoX ``rotate_half`` style as in Hugging Face Llama, applied **in place** to
    ``query`` and ``key``: ``x * cos + rotate_half(x) * sin`` in float32, rounded once to the dtype.

    With ``q_norm``/``k_norm`` (Qwen3), each head is first RMS-normalized over D exactly as
    :func:`rms_norm` does (rounded to the norm's output dtype), in the same pass: one launch for q and k.
    """
    ops = _use_triton(query)
    if ops is not None:
        ops.rotary_embedding(positions, query, key, cos_cache, sin_cache, q_norm, k_norm)
        return
    rotary_embedding_torch(positions, query, key, cos_cache, sin_cache, q_norm, k_norm)


def rotary_embedding_torch(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    q_norm: tuple[torch.Tensor, float] | None = None,
    k_norm: tuple[torch.Tensor, float] | None = None,
) -> None:
    """The PyTorch definition of :func:`rotary_embedding` (any device)."""
    cos = cos_cache[positions].unsqueeze(1)  # (T, 1, D/2), float32
    sin = sin_cache[positions].unsqueeze(1)
    for x, norm in ((query, q_norm), (key, k_norm)):
        normed = x if norm is None else rms_norm_torch(x, norm[0], norm[1])
        x.copy_(_rotate(normed, cos, sin))


def rotary_embedding_kv_write(
    positions: torch.Tensor,  # (T,) int64
    query: torch.Tensor,  # (T, Hq, D), last dim contiguous; may be a view into a fused qkv output
    key: torch.Tensor,  # (T, Hkv, D), same
    value: torch.Tensor,  # (T, Hkv, D), same
    cos_cache: torch.Tensor,  # (max_position, D/2) float32
    sin_cache: torch.Tensor,  # (max_position, D/2) float32
    target: "KVWriteTarget",  # the attention backend's cache views, slot mapping (T,), fp8 scales
    q_norm: tuple[torch.Tensor, float] | None = None,  # (weight (D,), eps)
    k_norm: tuple[torch.Tensor, float] | None = None,  # (weight (D,), eps)
) -> None:
    """:func:`rotary_embedding` (RoPE, Su et al. 2021, in place; with ``q_norm``/``k_norm`` after the
    per-head RMSNorm), then each token's rotated key and its value stored at its slot of ``target``'s paged
    cache, as vLLM's ``reshape_and_cache`` stores them (an fp8 cache gets ``x / scale`` saturated to the
    format's range; slot -1 = the token is rotated but not stored). Errors: AssertionError on shapes,
    dtypes or strides the kernel does not take (internal invariants: the layers always pass valid ones).

    On CUDA one kernel does both (instead of the RoPE kernel, then the KV-write kernel reading k back),
    with the same bits as the two. Elsewhere: :func:`rotary_embedding_torch`, then ``target.write``, the
    very ops the unfused path runs."""
    ops = _use_triton(query)
    if ops is not None:
        ops.rotary_embedding_kv_write(positions, query, key, value, cos_cache, sin_cache, target, q_norm, k_norm)
        return
    rotary_embedding_torch(positions, query, key, cos_cache, sin_cache, q_norm, k_norm)
    target.write(key, value)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # (T, 2I) -> (T, I), same dtype
    """SwiGLU's gate (Shazeer 2020): input ``[gate, up]`` on the last dim -> ``silu(gate) * up``, rounded
    to the dtype after the silu and after the product, as the two PyTorch ops round."""
    ops = _use_triton(x)
    if ops is not None:
        return ops.silu_and_mul(x)
    return silu_and_mul_torch(x)


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """The PyTorch definition of :func:`silu_and_mul` (any device)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
