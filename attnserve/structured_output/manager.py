"""StructuredOutputManager: the engine's grammar state: one matcher per constrained request, the step's bitmask.

Per step, on the host: the step's new tokens advance the matchers in one call (:meth:`accept_tokens`,
xgrammar's ``batch_accept_token``), then the next step's bitmask is filled in one call over a few threads
(:meth:`start_bitmask`, ``batch_fill_next_token_bitmask``, in a worker thread beside the engine's Python work:
the outputs of the step before and the plan of the step after) straight into a preallocated buffer, pinned on a GPU
engine, so the model runner copies it to the device without a host copy. The bitmask has a row for each
constrained sampling row only, over the grammar engine's vocabulary (the tokenizer's: ``num_tokens``), not the
logits' padded width; unconstrained rows are not copied and not masked (``bitmask.py``). Nothing per step is
proportional to the vocabulary on the host but the fill itself.

A step's bitmask needs the tokens of the step before (a matcher must hold every token of its request first):
with async scheduling the engine queues step k+1's forward pass, reads step k's tokens and advances the
matchers, fills step k+1's bitmask while the device runs that forward pass, then queues step k+1's sampling
(``LLMEngine.step``; vLLM defers the sampling of a step with structured-output requests the same way).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from attnserve.core.step import SchedulerOutput
from attnserve.core.structured_outputs import StructuredOutputsParams
from attnserve.structured_output.bitmask import GrammarBitmask

FILL_THREADS = 8  # at most: half the process's cores, as xgrammar's and vLLM's defaults


def fill_threads() -> int:
    """Threads of the bitmask fill: half the cores this process may run on, 1 to FILL_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(FILL_THREADS, cores // 2))


class PendingBitmask:
    """A step's bitmask while its fill may still run (:meth:`StructuredOutputManager.start_bitmask`)."""

    def __init__(self, bitmask: GrammarBitmask | None, filling: Future | None = None) -> None:
        self._bitmask = bitmask
        self._filling = filling

    def result(self) -> GrammarBitmask | None:
        """The bitmask, once filled (re-raises the fill's error); None when no sampling row is constrained."""
        if self._filling is not None:
            self._filling.result()
        return self._bitmask


class StructuredOutputManager:
    """Grammar matchers of the constrained requests (by request id) and the host side of the bitmask.

    ``pin_memory``: the bitmask buffers are pinned (a GPU engine: the runner's copy then needs no host copy
    and does not wait)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int | None, pin_memory: bool = False) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.pin_memory = pin_memory
        self._backend = None  # made on first use: an engine without constrained requests needs no xgrammar
        self._batch = None
        self.matchers: dict[str, object] = {}
        # two buffers used in turn: a step's bitmask stays intact while the step after it is filled
        self._buffers: list[torch.Tensor] = []
        self._turn = 0
        self._worker: ThreadPoolExecutor | None = None  # the bitmask fill's thread, made on first use

    @property
    def backend(self):
        if self._backend is None:
            from attnserve.structured_output.backend_xgrammar import XgrammarBackend

            stop = [] if self.eos_token_id is None else [self.eos_token_id]
            self._backend = XgrammarBackend(self.tokenizer, self.vocab_size, stop)
            self._batch = self._backend.batch_filler(fill_threads())
        return self._backend

    @property
    def active(self) -> bool:
        """True while a constrained request is unfinished."""
        return bool(self.matchers)

    def compile(self, params: StructuredOutputsParams) -> None:
        """Compile (or find cached) the constraint: Refused for an invalid one, or for xgrammar missing."""
        self.backend.compile(params)

    def add(self, request_id: str, params: StructuredOutputsParams) -> None:
        self.matchers[request_id] = self.backend.matcher(self.backend.compile(params))

    def remove(self, request_id: str) -> None:
        self.matchers.pop(request_id, None)

    def accept_tokens(self, tokens: list[tuple[str, int]]) -> list[str]:
        """Advance each constrained request's matcher by its new token ((request id, token id) pairs; ids without
        a matcher are skipped); returns the ids whose grammar ended: terminated (the request ends, finish reason
        ``stop``), or the token rejected (only an EOS the request ignores, or a stop token id)."""
        matchers = self.matchers
        ids, matched, toks = [], [], []
        for rid, t in tokens:
            m = matchers.get(rid)
            if m is not None:
                ids.append(rid)
                matched.append(m)
                toks.append(t)
        if not ids:
            return []
        return [ids[i] for i in self.backend.accept(matched, toks)]

    def has_unfinished(self, requests: dict) -> bool:
        """True while a constrained request is unfinished (``requests``: the scheduler's, by id), counting those
        that ended but whose matcher is not yet dropped as finished."""
        return any(rid in requests and not requests[rid].is_finished for rid in self.matchers)

    def bitmask(self, sched: SchedulerOutput) -> GrammarBitmask | None:
        """The step's bitmask over its constrained sampling rows (sampling rows: the scheduled requests that
        sample, in schedule order); None when no sampling row is constrained. ``words`` is a view of a reused
        buffer: valid until the call after next."""
        return self.start_bitmask(sched, in_thread=False).result()

    def start_bitmask(self, sched: SchedulerOutput, in_thread: bool = True) -> PendingBitmask:
        """:meth:`bitmask`, begun: the fill runs in the manager's worker thread (xgrammar's fill releases the GIL,
        so the caller's Python work runs beside it); its ``result()`` waits for it and gives the bitmask. The
        constrained requests' matchers must not change or go before then."""
        matchers = self.matchers
        rows, constrained = [], []
        j = 0
        for r in sched.requests:
            if r.samples:
                m = matchers.get(r.request_id)
                if m is not None:
                    rows.append(j)
                    constrained.append(m)
                j += 1
        if not constrained:
            return PendingBitmask(None)
        pinned = self._buffer(len(constrained))
        words = pinned.numpy()
        bitmask = GrammarBitmask(
            words, None if len(rows) == j else np.asarray(rows, dtype=np.int64), self.backend.vocab_size, pinned
        )
        if not in_thread:
            self._batch.batch_fill_next_token_bitmask(constrained, words)
            return PendingBitmask(bitmask)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnserve-grammar")
        return PendingBitmask(
            bitmask, self._worker.submit(self._batch.batch_fill_next_token_bitmask, constrained, words)
        )

    def _buffer(self, n: int) -> torch.Tensor:
        """Rows [0, n) of the next buffer in turn: (n, ceil(num_tokens / 32)) int32 on the host."""
        width = (self.backend.vocab_size + 31) // 32
        self._turn ^= 1
        if len(self._buffers) < 2 or self._buffers[self._turn].shape[0] < n:
            size = max(n, 64, 2 * (self._buffers[0].shape[0] if self._buffers else 0))
            self._buffers = [
                torch.empty((size, width), dtype=torch.int32, pin_memory=self.pin_memory) for _ in range(2)
            ]
        return self._buffers[self._turn][:n]
