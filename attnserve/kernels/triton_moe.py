"""The mixture-of-experts grouped GEMM in Triton (the algorithm of vLLM's ``fused_moe_kernel``).

One launch computes ``C[pair] = A[pair // top_k] @ B[expert(pair)]^T (+ bias) (* routing weight)`` for every
(token, slot) pair: ``moe_align_block_size`` (``moe.py``) sorts the pairs by expert and pads each expert's
run to a multiple of ``BLOCK_M``, so every row block of the sorted list belongs to one expert, whose weight
tile the program multiplies by the block's gathered rows. Programs are ordered in groups of ``GROUP_M``
row blocks for L2 reuse of the weight tiles. Accumulation is float32 (``input_precision="ieee"`` for
float32 inputs: no TF32), one rounding to the output dtype.

``fused_experts`` = GEMM 1 (w13, its bias) -> the activation (``moe.moe_activation``; SwiGLU through
``fused_ops.silu_and_mul``) -> GEMM 2 (w2, its bias, times the routing weight) -> the sum over each token's
``k`` pairs. Importing this module imports Triton; ``moe.py`` imports it on the first call with a CUDA tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnserve.kernels.moe import moe_activation, moe_align_block_size


@triton.jit
def _fused_moe_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    topk_weights_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    N,
    K,
    num_pairs,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_bias_e,
    capacity,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TOP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    PREC: tl.constexpr,
):
    # program -> (row block of the sorted pairs, column block of the output), grouped for L2 reuse
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(capacity, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return  # past the used blocks
    offs_sorted = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    pair = tl.load(sorted_ids_ptr + offs_sorted).to(tl.int64)  # padding entries hold num_pairs
    pair_mask = pair < num_pairs
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_bn = offs_n % N  # wrap instead of masking the weight loads; the store is masked
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (pair[:, None] // TOP_K) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + expert * stride_be + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=pair_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc=acc, input_precision=PREC)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_bias_e + offs_bn).to(tl.float32)
        acc = acc + bias[None, :]
    if MUL_ROUTED_WEIGHT:
        # the matmul (+ bias) rounded to the output dtype first, as the definition's F.linear rounds
        w = tl.load(topk_weights_ptr + pair, mask=pair_mask, other=0.0)
        acc = acc.to(c_ptr.dtype.element_ty).to(tl.float32) * w[:, None]

    c_ptrs = c_ptr + pair[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=pair_mask[:, None] & (offs_n[None, :] < N))


def block_config(num_tokens: int, dtype: torch.dtype) -> dict:
    """Tile sizes for a step of ``num_tokens`` tokens, after vLLM's H200 tunings for bfloat16
    (``configs/E=128,N=384,device_name=NVIDIA_H200.json``: BLOCK_M 16 up to 128 tokens, larger tiles past
    that); smaller K tiles and fewer stages for float32 (twice the shared memory per element)."""
    if num_tokens <= 32:
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    elif num_tokens <= 128:
        cfg = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=16, num_warps=4, num_stages=3)
    elif num_tokens <= 512:
        cfg = dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, GROUP_M=16, num_warps=4, num_stages=2)
    else:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
    if dtype == torch.float32:
        cfg.update(BLOCK_K=32, num_stages=2)
    return cfg


def invoke_grouped_gemm(
    a: torch.Tensor,  # (M, K): a row per token (top_k > 1) or per pair (top_k == 1)
    b: torch.Tensor,  # (E, N, K)
    c: torch.Tensor,  # (num_pairs, N), written
    bias: torch.Tensor | None,  # (E, N)
    topk_weights: torch.Tensor | None,  # (num_pairs,) float32: multiply each row by its pair's weight
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_padded: torch.Tensor,
    top_k: int,
    cfg: dict,
) -> None:
    """One launch of the grouped GEMM over the schedule ``moe_align_block_size`` made with ``cfg``'s BLOCK_M."""
    E, N, K = b.shape
    capacity = sorted_ids.numel()
    grid = (triton.cdiv(capacity, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)
    _fused_moe_kernel[grid](
        a,
        b,
        c,
        bias if bias is not None else b,
        topk_weights if topk_weights is not None else b,
        sorted_ids,
        expert_ids,
        num_padded,
        N,
        K,
        c.shape[0],
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        c.stride(0),
        c.stride(1),
        bias.stride(0) if bias is not None else 0,
        capacity,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"],
        GROUP_M=cfg["GROUP_M"],
        TOP_K=top_k,
        HAS_BIAS=bias is not None,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        PREC="ieee" if a.dtype == torch.float32 else None,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def fused_experts(
    x: torch.Tensor,  # (T, H)
    w13: torch.Tensor,  # (E, 2I, H)
    w2: torch.Tensor,  # (E, H, I)
    topk_weights: torch.Tensor,  # (T, k) float32
    topk_ids: torch.Tensor,  # (T, k) int32
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float = 7.0,
) -> torch.Tensor:  # (T, H), x's dtype
    """``moe.fused_experts_reference`` in two grouped-GEMM launches (module docstring)."""
    T, H = x.shape
    E, two_i, _ = w13.shape
    k = topk_ids.shape[1]
    pairs = T * k
    cfg = block_config(T, x.dtype)
    sorted_ids, expert_ids, num_padded = moe_align_block_size(topk_ids, cfg["BLOCK_M"], E)
    x = x.contiguous()
    gate_up = torch.empty(pairs, two_i, dtype=x.dtype, device=x.device)
    invoke_grouped_gemm(x, w13, gate_up, w13_bias, None, sorted_ids, expert_ids, num_padded, k, cfg)
    if activation == "silu":
        from attnserve.kernels.fused_ops import silu_and_mul

        h = silu_and_mul(gate_up)
    else:
        h = moe_activation(gate_up, activation, alpha, limit)
    out = torch.empty(pairs, H, dtype=x.dtype, device=x.device)
    invoke_grouped_gemm(
        h, w2, out, w2_bias, topk_weights.reshape(-1).float().contiguous(), sorted_ids, expert_ids, num_padded, 1, cfg
    )
    return out.view(T, k, H).sum(dim=1, dtype=torch.float32).to(x.dtype)
