"""Merging a split-KV attention call's partial results: each split of a query tile's KV tiles wrote its
normalized output and its log-sum-exp; the merge weighs each split by ``exp(lse - max lse)`` and divides by
their sum (vLLM's ``merge_attn_states``, for any number of splits; splits that saw no key have lse -inf and
weigh 0). ``triton_attention.paged_attention`` launches it after a split call; the oracle of the whole is
``reference.py``. Importing this module imports Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnserve.kernels import pdl
from attnserve.kernels.triton_common import pdl_wait


def partial_results(
    num_tokens: int, num_heads: int, num_splits: int, head_pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialized buffers for a split call: outputs (T, Hq, NUM_SPLITS, HEAD_PAD) and log-sum-exps
    (T, Hq, NUM_SPLITS), float32; ``num_splits`` any count of slots (a cascade's two calls' splits together)."""
    part_out = torch.empty((num_tokens, num_heads, num_splits, head_pad), dtype=torch.float32, device=device)
    return part_out, torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32, device=device)


@triton.jit
def _merge_splits_kernel(
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    tok_offset,
    stride_ot,
    stride_oh,
    num_q_heads,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    tok = tl.program_id(0).to(tl.int64) + tok_offset
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)  # slots past NUM_SPLITS: lse -inf, weight 0
    offs_d = tl.arange(0, HEAD_PAD)
    row = (tok * num_q_heads + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + row + offs_s, mask=offs_s < NUM_SPLITS, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    w = tl.where(lse == float("-inf"), 0.0, tl.exp(lse - lse_max))
    o = tl.load(
        part_out_ptr + (row + offs_s)[:, None] * HEAD_PAD + offs_d[None, :],
        mask=(offs_s < NUM_SPLITS)[:, None],
        other=0.0,
    )
    merged = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + offs_d, merged.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD
    )


def merge_splits(
    out: torch.Tensor,  # (T, Hq, D): rows first .. end - 1 written
    part_out: torch.Tensor,  # (T, Hq, NUM_SPLITS, HEAD_PAD) float32, from partial_results
    part_lse: torch.Tensor,  # (T, Hq, NUM_SPLITS) float32
    token_range: tuple[int, int],  # (first, end): the tokens the split call covered
    head: int,  # D
) -> None:
    """Every token's and head's merged output, in ``out``'s dtype."""
    first, end = token_range
    num_heads, num_splits, head_pad = part_out.shape[1:]
    _merge_splits_kernel[(end - first, num_heads)](
        out,
        part_out,
        part_lse,
        first,
        out.stride(0),
        out.stride(1),
        num_heads,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD=head,
        HEAD_PAD=head_pad,
        **pdl.launch(out),
    )
