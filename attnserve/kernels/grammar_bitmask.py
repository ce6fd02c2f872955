"""A grammar bitmask applied to logits (structured outputs): the Triton kernel (``triton_grammar_bitmask.py``) on
CUDA, the PyTorch definition elsewhere and where Triton is missing; both give the same bits.

Shapes and dtypes: ``logits`` (R, V) float, changed in place; ``words`` (C, W) int32, bit ``t % 32`` of word
``t // 32`` of row c set = token ``t`` allowed; ``rows`` (C,) int64, the logits row of bitmask row c (None: row
c); tokens ``t >= num_tokens`` (past the grammar engine's vocabulary) are never allowed in those rows.
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np
import torch

_bits: dict[torch.device, torch.Tensor] = {}


@functools.cache
def _triton_bitmask() -> ModuleType | None:
    """``attnserve.kernels.triton_grammar_bitmask``, or None where Triton is not installed."""
    try:
        from attnserve.kernels import triton_grammar_bitmask
    except ImportError:
        return None
    return triton_grammar_bitmask


def apply_bitmask(
    logits: torch.Tensor, words: torch.Tensor, rows: torch.Tensor | None, num_tokens: int
) -> torch.Tensor:
    """``logits`` with every token the bitmask does not allow set to -inf, in place; returned. Rows the bitmask
    does not list are not touched. On CUDA one Triton launch, elsewhere :func:`apply_bitmask_torch`; no host
    sync."""
    ops = _triton_bitmask() if logits.is_cuda and logits.stride(1) == 1 else None
    if ops is not None:
        return ops.apply_bitmask_inplace(logits, words, rows, num_tokens)
    return apply_bitmask_torch(logits, words, rows, num_tokens)


def _bit_values(device: torch.device) -> torch.Tensor:  # (32,) int32: 1 << i, bit 31 as int32's minimum
    bits = _bits.get(device)
    if bits is None:
        bits = _bits[device] = (torch.ones(32, dtype=torch.int64) << torch.arange(32)).to(torch.int32).to(device)
    return bits


def apply_bitmask_torch(
    logits: torch.Tensor, words: torch.Tensor | np.ndarray, rows: torch.Tensor | None, num_tokens: int
) -> torch.Tensor:
    """The PyTorch definition of :func:`apply_bitmask` (any device): a few elementwise kernels over the
    constrained rows' C x V entries."""
    vocab = logits.shape[1]
    covered = min(vocab, num_tokens, words.shape[1] * 32)
    target = logits if rows is None else logits.index_select(0, rows)
    if logits.device.type == "cpu":  # numpy unpacks bits through a table: (C, covered) bool, True = allowed
        host = words.contiguous().numpy() if isinstance(words, torch.Tensor) else np.ascontiguousarray(words)
        allowed = np.unpackbits(host.view(np.uint8), axis=1, count=covered, bitorder="little")
        blocked = torch.from_numpy(allowed.view(np.bool_)).logical_not_()
    else:  # (C, W, 32) bool: bit j of word w clear = token 32 w + j not allowed
        blocked = torch.bitwise_and(words[:, :, None], _bit_values(logits.device)) == 0
        blocked = blocked.view(words.shape[0], -1)[:, :covered]
    target[:, :covered].masked_fill_(blocked, float("-inf"))
    if covered < vocab:
        target[:, covered:] = float("-inf")
    if rows is not None:
        logits.index_copy_(0, rows, target)
    return logits
