"""GreedyHead: the sampler's strategy for a step's LM head, chosen once at start-up.

Where the GEMV plan installed a fused LM head + argmax (``gemv.methods.FusedGreedyHead``: the tokens without
the (B, vocab) logits), a step whose every row is greedy without logprobs or logits processing takes its
tokens from it, with the step's grammar bitmask applied inside the head where some rows are constrained
(structured outputs); every other step, and every step of an engine without one, computes its logits and samples.
"""

from __future__ import annotations

from typing import Callable

import torch

from attnserve.core.sampling_params import SamplingParams


class GreedyHead:
    """``fused``: ``fused(hidden, grammar)`` -> tokens (B,) int64 from hidden (B, H), the device's
    ``GrammarBitmask`` (or None) applied first, or None for a row count it does not cover; ``fused.covers(B)``
    says which. None: no fused head (every step computes its logits)."""

    def __init__(self, fused: Callable | None = None) -> None:
        self.fused = fused

    def applies(self, params: list[SamplingParams]) -> bool:
        """True when a step of these rows (``params``, in row order) takes the fused head's tokens: every row is
        greedy without logprobs and without a logits processor, and the head covers that many rows."""
        return (
            self.fused is not None
            and self.fused.covers(len(params))
            and not any(p.temperature != 0.0 or p.logprobs is not None or p.changes_logits for p in params)
        )

    def warm_masked(self) -> None:
        """Compile the fused head's masked kernels now (structured outputs; nothing without a fused head)."""
        if self.fused is not None:
            self.fused.warm_masked()

    def tokens(self, hidden: torch.Tensor, params: list[SamplingParams], grammar=None) -> torch.Tensor | None:
        """The step's tokens (B,) int64 from the fused head where it :meth:`applies`, ``grammar`` (the device's
        ``GrammarBitmask``, its ``index`` staged where it has ``rows``) masking its rows' logits first; None
        otherwise (the caller computes the logits and samples)."""
        return self.run(hidden, grammar) if self.applies(params) else None

    def run(self, hidden: torch.Tensor, grammar=None) -> torch.Tensor:
        """:meth:`tokens` for a step the caller found it :meth:`applies` to (asked once per step)."""
        return self.fused(hidden, grammar)
