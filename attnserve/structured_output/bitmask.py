"""A step's grammar bitmask: the record the engine fills on the host, its copy to the device, its application.

The engine fills one row per constrained sampling row (``StructuredOutputManager.bitmask``); on a GPU engine the
grammar's worker thread also copies it to the device right after the fill (``DeviceBitmaskBuffers``), otherwise
the model runner copies it with the step's sampling (``GrammarBitmask.to``). The runner applies it to those
rows' logits before the sampler (``apply_grammar_bitmask``: ``kernels/grammar_bitmask.py``), or the fused greedy
head applies it inside itself; rows of unconstrained requests are neither copied nor touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnserve.kernels import grammar_bitmask

_copy_streams: dict[torch.device, torch.cuda.Stream] = {}


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
    # ``words`` already on a device: the event its copy recorded (the worker thread's side stream), which the
    # stream that reads it waits for (:meth:`to`)
    ready: torch.cuda.Event | None = field(default=None, repr=False, compare=False)
    # (R,) int32 on the device, from ``to(..., with_index=True)`` with ``rows``: each sampling row's bitmask row
    index: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def row_index(self) -> np.ndarray:
        """(R,) int32 on the host: sampling row i's bitmask row, -1 for a row the bitmask does not constrain (the
        inverse of host ``rows``; ``kernels/triton_greedy_head.py``'s ``mask_index``)."""
        index = np.full(self.num_rows, -1, dtype=np.int32)
        index[self.rows] = np.arange(len(self.rows), dtype=np.int32)
        return index

    def __getstate__(self) -> dict:
        return {**self.__dict__, "pinned": None, "ready": None}

    def to(self, staging, with_index: bool = False) -> GrammarBitmask:
        """The same bitmask on ``staging``'s device (non-blocking copies; ``PinnedStaging``): ``words`` straight
        from its pinned buffer on a side stream that the current one then waits for, ``rows`` (or with
        ``with_index``, :meth:`row_index` as ``index``, for the fused greedy head) through the staging's own
        buffers. ``words`` already on that device (copied by the grammar's worker thread): the current stream
        waits for that copy's event, and nothing else is copied but ``rows`` or ``index``."""
        rows = index = None
        if self.rows is not None and with_index:
            index = staging.to_device("grammar_index", self.row_index())
        elif self.rows is not None:
            rows = staging.to_device("grammar_rows", self.rows)
        if isinstance(self.words, torch.Tensor) and self.words.is_cuda:  # the one device a runner samples on
            if self.ready is not None:
                torch.cuda.current_stream(staging.device).wait_event(self.ready)
            return GrammarBitmask(self.words, rows, self.num_tokens, self.num_rows, index=index)
        words = self.pinned if self.pinned is not None else torch.from_numpy(self.words)
        if staging.cuda:  # on a side stream: the copy overlaps the LM head queued before it
            main = torch.cuda.current_stream(staging.device)
            side = _copy_streams.get(staging.device)
            if side is None:
                side = _copy_streams[staging.device] = torch.cuda.Stream(staging.device)
            with torch.cuda.stream(side):
                words = words.to(staging.device, non_blocking=True)
            main.wait_stream(side)
            words.record_stream(main)  # allocated on the side stream, read on the main one
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


class DeviceBitmaskBuffers:
    """Device twins of the manager's two pinned bitmask buffers, which the grammar's worker thread fills by a copy
    on a side stream right after it fills the host's (a GPU engine whose model runner is in this process).

    A buffer is reused two steps later: by then the host has read the tokens of the step between, so the device
    finished the sampling that read it. Buffers are made on the main thread (:meth:`target`) and grow by doubling;
    a new one waits for the device to be idle once, since its memory may have been a tensor the queued kernels
    still use."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream: torch.cuda.Stream | None = None
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._events: list[torch.cuda.Event | None] = [None, None]

    def target(self, turn: int, rows: int, width: int) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Rows [0, rows) of device buffer ``turn`` ((rows, width) int32) and the event its copy records."""
        buf = self._buffers[turn]
        if buf is None or buf.shape[0] < rows or buf.shape[1] != width:
            torch.cuda.current_stream(self.device).synchronize()
            size = max(rows, 64, 2 * (buf.shape[0] if buf is not None else 0))
            buf = self._buffers[turn] = torch.empty((size, width), dtype=torch.int32, device=self.device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
            self._events = [torch.cuda.Event(), torch.cuda.Event()]
        return buf[:rows], self._events[turn]

    def copy(self, src: torch.Tensor, dst: torch.Tensor, event: torch.cuda.Event) -> None:
        """Queue ``dst.copy_(src)`` (pinned host -> device) on the side stream and record ``event`` after it; any
        thread."""
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)
            event.record(self._stream)
