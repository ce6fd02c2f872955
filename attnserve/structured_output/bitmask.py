"""A step's grammar bitmask: the record the engine fills on the host, its copy to the device, its application.

The engine fills one row per constrained sampling row (``StructuredOutputManager.bitmask``); the model runner
copies it to the device with the step's sampling (``GrammarBitmask.to``: one non-blocking copy from the pinned
buffer on the current stream, where the device has the time: a structured step is host-bound) and applies it to
those rows' logits before the sampler (``apply_grammar_bitmask``: ``kernels/grammar_bitmask.py``), or the fused
greedy head applies it inside itself; rows of unconstrained requests are neither copied nor touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnserve.kernels import grammar_bitmask


@dataclass
class GrammarBitmask:
    """The allowed tokens of a step's constrained sampling rows.

    ``words``: (C, W) int32, bit ``t % 32`` of word ``t // 32`` set = token ``t`` allowed, for tokens
    ``t < num_tokens`` (the grammar engine's vocabulary: the tokenizer's, ``W = ceil(num_tokens / 32)``); tokens
    from ``num_tokens`` up to the logits' width are never allowed in these rows. ``rows``: (C,) int64, the
    constrained rows' indices among the step's R sampling rows, ascending; None when all R rows are constrained
    (row i = sampling row i). On the host both are numpy (``words`` a view of a reused, pinned buffer on a GPU
    engine: valid until the engine fills the step after next); :meth:`to` gives the device's torch tensors.
    """

    words: np.ndarray | torch.Tensor
    rows: np.ndarray | torch.Tensor | None
    num_tokens: int
    num_rows: int | None = None  # R (None: not known; then no :meth:`row_index`)
    # the pinned CPU tensor ``words`` views (the copy's source; not pickled: worker processes get ``words``)
    pinned: torch.Tensor | None = field(default=None, repr=False, compare=False)
    # (R,) int32 on the device, from ``to(..., with_index=True)`` with ``rows``: each sampling row's bitmask row
    index: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def row_index(self) -> np.ndarray:
        """(R,) int32 on the host: sampling row i's bitmask row, -1 for a row the bitmask does not constrain (the
        inverse of host ``rows``; ``kernels/triton_greedy_head.py``'s ``mask_index``)."""
        index = np.full(self.num_rows, -1, dtype=np.int32)
        index[self.rows] = np.arange(len(self.rows), dtype=np.int32)
        return index

    def __getstate__(self) -> dict:
        return {**self.__dict__, "pinned": None}

    def to(self, staging, with_index: bool = False) -> GrammarBitmask:
        """The same bitmask on ``staging``'s device (``PinnedStaging``): ``words`` copied from its pinned buffer on
        the current stream (non-blocking: one foreign call; the buffer is refilled only after the host has read the
        tokens of a later step on that stream), ``rows`` (or with ``with_index``, :meth:`row_index` as ``index``,
        for the fused greedy head) through the staging's own buffers."""
        rows = index = None
        if self.rows is not None and with_index:
            index = staging.to_device("grammar_index", self.row_index())
        elif self.rows is not None:
            rows = staging.to_device("grammar_rows", self.rows)
        words = self.words
        if not isinstance(words, torch.Tensor):
            words = self.pinned if self.pinned is not None else torch.from_numpy(words)
        # from pageable memory (no pinned buffer) the non-blocking copy is in effect a blocking one
        words = words.to(staging.device, non_blocking=True)
        return GrammarBitmask(words, rows, self.num_tokens, self.num_rows, index=index)


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: GrammarBitmask | None) -> torch.Tensor:
    """``logits`` (R, V) with every token its row's bitmask does not allow set to -inf, in place; returned.

    ``bitmask``: on the logits' device (:meth:`GrammarBitmask.to`); None: ``logits`` unchanged. Rows the
    bitmask does not list are not touched. One Triton launch on CUDA, the PyTorch definition elsewhere
    (``kernels/grammar_bitmask.py``); no host sync."""
    if bitmask is None:
        return logits
    return grammar_bitmask.apply_bitmask(logits, bitmask.words, bitmask.rows, bitmask.num_tokens)


def apply_grammar_bitmask_torch(logits: torch.Tensor, bitmask: GrammarBitmask) -> torch.Tensor:
    """The PyTorch definition of :func:`apply_grammar_bitmask` (any device)."""
    return grammar_bitmask.apply_bitmask_torch(logits, bitmask.words, bitmask.rows, bitmask.num_tokens)
