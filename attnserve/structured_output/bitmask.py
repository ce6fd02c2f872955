"""The device side of structured outputs: a step's token bitmask applied to its logits before sampling."""

from __future__ import annotations

import torch

_shifts: dict[torch.device, torch.Tensor] = {}


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor | None) -> torch.Tensor:
    """``logits`` (R, V) with every token the bitmask does not allow set to -inf (in place; returned).

    ``bitmask``: (R, ceil(V / 32)) int32 on the logits' device, bit ``t % 32`` of word ``t // 32`` = token ``t``
    allowed (``StructuredOutputManager.bitmask``); None: ``logits`` unchanged. Unpacked with shifts (a few
    elementwise kernels over R x V, no host sync)."""
    if bitmask is None:
        return logits
    shifts = _shifts.get(logits.device)
    if shifts is None:
        shifts = _shifts[logits.device] = torch.arange(32, dtype=torch.int32, device=logits.device)
    vocab = logits.shape[-1]
    allowed = ((bitmask[:, :, None] >> shifts) & 1).view(bitmask.shape[0], -1)[:, :vocab]
    return logits.masked_fill_(allowed == 0, float("-inf"))
