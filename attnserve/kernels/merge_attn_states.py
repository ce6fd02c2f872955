"""Merge two partial attention results over disjoint key sets into the attention over their union.

Cascade attention (``attention/cascade.py``) splits a decode step's keys into a prefix every request shares and
each request's own suffix, attends to each part separately and merges: with ``lse`` the log-sum-exp of a part's
scaled scores, the union's output is ``(o_a * exp(lse_a - m) + o_b * exp(lse_b - m)) / (exp(lse_a - m) +
exp(lse_b - m))``, ``m = max(lse_a, lse_b)`` (FlashInfer's ``merge_state``, vLLM's ``merge_attn_states``).

The Triton kernel (``triton_merge_attn_states``) runs on CUDA; :func:`merge_attn_states_torch` is the definition.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch


@functools.cache
def _triton_merge() -> ModuleType | None:
    """``attnserve.kernels.triton_merge_attn_states``, or None where Triton is not installed."""
    try:
        from attnserve.kernels import triton_merge_attn_states
    except ImportError:
        return None
    return triton_merge_attn_states


def merge_attn_states(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The attention over keys A and B from each part's output ``o`` (T, H, D) (16- or 32-bit) and log-sum-exp
    ``lse`` (H, T) float32 (FlashAttention's layout); returns (T, H, D) in ``o_a``'s dtype (into ``out`` if
    given). A part whose ``lse`` is -inf (no keys) contributes nothing; both -inf gives 0."""
    ops = _triton_merge() if o_a.is_cuda else None
    if ops is None:
        return merge_attn_states_torch(o_a, lse_a, o_b, lse_b, out)
    return ops.merge_attn_states(o_a, lse_a, o_b, lse_b, out)


def merge_attn_states_torch(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The PyTorch definition of :func:`merge_attn_states`, computed in float32."""
    la, lb = lse_a.float().t(), lse_b.float().t()  # (T, H)
    m = torch.maximum(la, lb)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both empty: weights 0, output 0
    wa, wb = torch.exp(la - m), torch.exp(lb - m)
    total = (wa + wb).clamp_min(torch.finfo(torch.float32).tiny)
    merged = (o_a.float() * (wa / total)[..., None] + o_b.float() * (wb / total)[..., None]).to(o_a.dtype)
    if out is None:
        return merged
    out.copy_(merged)
    return out
