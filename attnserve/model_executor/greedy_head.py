"""GreedyHead: the sampler's strategy for a step's LM head, chosen once at start-up.

Where the GEMV plan installed a fused LM head + argmax (``gemv.methods.FusedGreedyHead``: the tokens without
the (B, vocab) logits), a step whose every row is greedy without logprobs or logits processing takes its
tokens from it; every other step, and every step of an engine without one, computes its logits and samples.
"""

from __future__ import annotations

from typing import Callable

import torch

from attnserve.core.sampling_params import SamplingParams


class GreedyHead:
    """``fused``: hidden (B, H) -> tokens (B,) int64, or None for a row count it does not cover; None: no fused
    head (every step computes its logits)."""

    def __init__(self, fused: Callable[[torch.Tensor], torch.Tensor | None] | None = None) -> None:
        self.fused = fused

    def tokens(self, hidden: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor | None:  # (B,) int64
        """The step's tokens from the fused head when every row (``params``, in row order) is greedy without
        logprobs and without a logits processor, and the head covers B rows; None otherwise (the caller
        computes the logits and samples)."""
        if self.fused is None or any(
            p.temperature != 0.0 or p.logprobs is not None or p.changes_logits for p in params
        ):
            return None
        return self.fused(hidden)
