"""A step's grammar bitmask applied to the logits in one Triton launch (structured outputs).

Shapes and dtypes: ``logits`` (R, V) float32, float16 or bfloat16, last dim contiguous, changed in place;
``words`` (C, W) int32, bit ``t % 32`` of word ``t // 32`` of row c set = token ``t`` allowed; ``rows`` (C,)
int64, the logits row of bitmask row c (None: row c). Tokens ``t >= num_tokens`` (the grammar engine's
vocabulary ends there, the logits' width may pad past it) are never allowed. The result is
``grammar_bitmask.apply_bitmask_torch``'s, bit for bit: disallowed entries become -inf, the others keep
their value.

Why: the PyTorch definition takes about eight kernels (gather the rows, unpack the bits, compare, fill, scatter
the rows back), whose launches sit on the host's critical path of a constrained decode step; this is one
launch, and it writes only the entries it masks. xgrammar and vLLM apply their bitmask with such a kernel too
(``apply_token_bitmask_inplace``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  # logits columns per program: 16 per thread of 4 warps (64 bitmask words)


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    words_ptr,
    rows_ptr,
    n_cols,
    covered,
    stride_logits,
    stride_words,
    HAS_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (C, cdiv(n_cols, BLOCK)): program (c, b) masks columns [b * BLOCK, (b + 1) * BLOCK) of bitmask row c's
    logits row."""
    c = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + c) if HAS_ROWS else c
    # past ``covered`` the word reads as 0: no token there is allowed
    word = tl.load(words_ptr + c * stride_words + (cols >> 5), mask=cols < covered, other=0)
    blocked = (cols < n_cols) & (((word >> (cols & 31)) & 1) == 0)
    tl.store(logits_ptr + row * stride_logits + cols, float("-inf"), mask=blocked)


def apply_bitmask_inplace(
    logits: torch.Tensor, words: torch.Tensor, rows: torch.Tensor | None, num_tokens: int
) -> torch.Tensor:
    """``logits`` with every token the bitmask does not allow set to -inf, in place; returned (see the module
    docstring for the shapes). Raises ValueError for logits that are not a (R, V) 16/32-bit float matrix with
    contiguous rows, or words that are not (C, W) int32."""
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.float16, torch.bfloat16) or logits.stride(1) != 1:
        raise ValueError(f"logits must be a (R, V) float matrix with contiguous rows, got {tuple(logits.shape)}")
    if words.dim() != 2 or words.dtype != torch.int32 or words.stride(1) != 1:
        raise ValueError(f"words must be a (C, W) int32 matrix, got {tuple(words.shape)} {words.dtype}")
    num_rows, vocab = logits.shape
    if words.shape[0] == 0 or vocab == 0:
        return logits
    if rows is None and words.shape[0] > num_rows:
        raise ValueError(f"{words.shape[0]} bitmask rows for {num_rows} logits rows")
    covered = min(vocab, num_tokens, words.shape[1] * 32)
    _apply_bitmask_kernel[(words.shape[0], triton.cdiv(vocab, BLOCK))](
        logits,
        words,
        words if rows is None else rows,  # unused without rows
        vocab,
        covered,
        logits.stride(0),
        words.stride(0),
        HAS_ROWS=rows is not None,
        BLOCK=BLOCK,
    )
    return logits
