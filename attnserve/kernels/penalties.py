"""vLLM's penalties on a logits matrix, in place: the Triton kernel (``triton_penalties.py``) on CUDA, the PyTorch
definition elsewhere and where Triton is missing. Both give the same float32 values bit for bit (each operation
rounded once, as PyTorch's kernels do).

A row ``rows[i]`` of ``logits`` takes request state row ``slots[i]``: ``counts`` (occurrences of each token in the
output) and ``prompt_mask`` (tokens of the prompt). A token seen in either has its logit divided by the
repetition penalty when positive and multiplied when not; then ``logit -= frequency * count + presence * (count
> 0)`` (vLLM ``v1/sample/ops/penalties.py``; OpenAI's definition of presence and frequency penalties).
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch


@functools.cache
def _triton_penalties() -> ModuleType | None:
    """``attnserve.kernels.triton_penalties``, or None where Triton is not installed."""
    try:
        from attnserve.kernels import triton_penalties
    except ImportError:
        return None
    return triton_penalties


def apply_penalties(
    logits: torch.Tensor,  # (B, V) float32, contiguous rows; modified in place
    rows: torch.Tensor,  # (P,) int64: the rows of logits to penalize (distinct)
    slots: torch.Tensor,  # (P,) int64: each one's row in counts and prompt_mask
    counts: torch.Tensor,  # (S, V) int32
    prompt_mask: torch.Tensor,  # (S, V) bool
    presence: torch.Tensor | None,  # (P,) float32; None = all 0
    frequency: torch.Tensor | None,  # (P,) float32; None = all 0
    repetition: torch.Tensor | None,  # (P,) float32; None = all 1
) -> None:
    """Apply the penalties to ``logits[rows]`` in place (one kernel on CUDA)."""
    ops = _triton_penalties() if logits.is_cuda else None
    fn = ops.apply_penalties if ops is not None else apply_penalties_torch
    fn(logits, rows, slots, counts, prompt_mask, presence, frequency, repetition)


def apply_penalties_torch(logits, rows, slots, counts, prompt_mask, presence, frequency, repetition) -> None:
    """The PyTorch definition of :func:`apply_penalties` (any device)."""
    x = logits.index_select(0, rows)
    c = counts.index_select(0, slots)
    if repetition is not None:
        seen = prompt_mask.index_select(0, slots) | (c > 0)
        penalty = torch.where(seen, repetition[:, None], 1.0)
        x.copy_(torch.where(x > 0, x / penalty, x * penalty))
    if frequency is not None:
        x.sub_(frequency[:, None] * c)
    if presence is not None:
        x.sub_(presence[:, None] * (c > 0))
    logits.index_copy_(0, rows, x)
