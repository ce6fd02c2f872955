"""Mixture of experts: top-k routing and the experts' two matmuls over the routed tokens.

Two implementations with one contract: the grouped GEMM in Triton (``triton_moe.py``, vLLM's ``fused_moe``
algorithm: tokens sorted by expert and padded to the block size, one launch per matmul over every
expert) for CUDA tensors, and the plain-PyTorch definition below (a loop over the experts that were
chosen, as transformers computes it) everywhere else and on CUDA when Triton is missing.

Weights, per layer (this tensor-parallel rank's part: ``I`` = the rank's share of each expert's
intermediate size):

- ``w13`` (E, 2I, H): each expert's gate rows, then its up rows (vLLM's ``w13_weight``);
- ``w2`` (E, H, I): each expert's down projection;
- optional biases ``w13_bias`` (E, 2I) and ``w2_bias`` (E, H) (gpt-oss).

Activations (``activation``): ``"silu"`` is SwiGLU, ``silu(gate) * up`` (Mixtral, Qwen3-MoE);
``"swigluoai"`` is gpt-oss's variant: ``gate`` clamped to at most ``limit``, ``up`` to
``[-limit, limit]``, then ``(up + 1) * gate * sigmoid(alpha * gate)``.

Numerics: each matmul's output is rounded to the activations' dtype, as the per-expert ``F.linear`` calls
round; each token's ``k`` weighted expert outputs are summed in float32 and rounded once.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F

ACTIVATIONS = ("silu", "swigluoai")


def topk_routing(
    router_logits: torch.Tensor,  # (T, E) model dtype or float32
    top_k: int,
    renormalize: bool,
    softmax_after_topk: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # weights (T, k) float32, expert ids (T, k) int32
    """Each token's ``top_k`` experts and their weights.

    ``softmax_after_topk`` False (Mixtral, Qwen3-MoE): softmax over all experts in float32, the ``top_k``
    largest, then, with ``renormalize``, divided by their sum (Qwen3-MoE's ``norm_topk_prob``; Mixtral
    always). True (gpt-oss): the ``top_k`` largest logits, then a softmax over those (``renormalize`` is
    implied). The weights stay float32 (vLLM's; transformers rounds them to the model dtype).
    """
    if softmax_after_topk:
        values, ids = torch.topk(router_logits, top_k, dim=-1)
        weights = torch.softmax(values.float(), dim=-1)
    else:
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def moe_activation(
    gate_up: torch.Tensor,  # (N, 2I): [gate | up]
    activation: str = "silu",
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:  # (N, I), gate_up's dtype
    """The gated activation of one expert's gate/up output (see the module docstring); ``alpha`` and
    ``limit`` are used by ``"swigluoai"`` only. Raises ValueError for another activation name."""
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "swigluoai":
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))
    raise ValueError(f"activation {activation!r} not supported (supported: {', '.join(ACTIVATIONS)})")


def fused_experts_reference(
    x: torch.Tensor,  # (T, H)
    w13: torch.Tensor,  # (E, 2I, H)
    w2: torch.Tensor,  # (E, H, I)
    topk_weights: torch.Tensor,  # (T, k) float32
    topk_ids: torch.Tensor,  # (T, k) int, in [0, E)
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,  # (E, 2I)
    w2_bias: torch.Tensor | None = None,  # (E, H)
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:  # (T, H), x's dtype
    """The definition: for each chosen expert, its tokens through ``w2(act(w13 x + b13)) + b2``, times the
    routing weight, summed over each token's ``k`` experts in float32."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in topk_ids.unique().tolist():
        token_idx, slot = torch.where(topk_ids == e)
        h = F.linear(x[token_idx], w13[e], None if w13_bias is None else w13_bias[e])
        y = F.linear(moe_activation(h, activation, alpha, limit), w2[e], None if w2_bias is None else w2_bias[e])
        out.index_add_(0, token_idx, (y.float() * topk_weights[token_idx, slot, None]).to(x.dtype).float())
    return out.to(x.dtype)


@functools.cache
def _triton_moe() -> ModuleType | None:
    """``attnserve.kernels.triton_moe``, or None where Triton is not installed."""
    try:
        from attnserve.kernels import triton_moe
    except ImportError:
        return None
    return triton_moe


def fused_experts(
    x: torch.Tensor,  # (T, H) float32 / float16 / bfloat16
    w13: torch.Tensor,  # (E, 2I, H), x's dtype
    w2: torch.Tensor,  # (E, H, I), x's dtype
    topk_weights: torch.Tensor,  # (T, k) float32
    topk_ids: torch.Tensor,  # (T, k) int32
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:  # (T, H), x's dtype
    """:func:`fused_experts_reference`'s result: the Triton grouped GEMM on CUDA, the definition elsewhere."""
    ops = _triton_moe() if x.is_cuda else None
    if ops is None:
        return fused_experts_reference(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, alpha, limit)
    return ops.fused_experts(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias, alpha, limit)


def moe_align_block_size(
    topk_ids: torch.Tensor,  # (T, k) int, in [0, E)
    block_size: int,
    num_experts: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The grouped GEMM's schedule (vLLM's ``moe_align_block_size``), in PyTorch ops with no host sync
    (CUDA-graph capturable): the ``T * k`` (token, slot) pairs, flattened as ``token * k + slot``, sorted by
    expert, each expert's run padded to a multiple of ``block_size`` with the index ``T * k`` (no pair).

    Returns ``sorted_ids`` (T*k + E*(block_size-1),) int32, ``expert_ids`` (ceil(its length / block_size),) int32:
    the expert of each block (blocks past the used ones repeat the last expert; the kernel skips them), and
    ``num_padded`` (1,) int32: how many entries of ``sorted_ids`` are used (a multiple of ``block_size``).
    """
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    capacity = n + num_experts * (block_size - 1)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size
    padded_end = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)  # pair indices grouped by expert, in token order within one
    sorted_experts = flat[order]
    first_of_expert = counts.cumsum(0) - counts  # where each expert's pairs start in `order`
    rank = torch.arange(n, device=flat.device) - first_of_expert[sorted_experts]
    position = padded_end[sorted_experts] - padded[sorted_experts] + rank
    sorted_ids = torch.full((capacity,), n, dtype=torch.int32, device=flat.device)
    sorted_ids[position] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block_size, device=flat.device)
    expert_ids = torch.searchsorted(padded_end, block_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, expert_ids.to(torch.int32), padded_end[-1:].to(torch.int32)
