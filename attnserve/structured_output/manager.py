"""StructuredOutputManager: the engine's grammar state: one matcher per constrained request, the step's bitmask.

Per step, on the host: the step's new tokens advance the matchers in one call (:meth:`accept_tokens`,
xgrammar's ``batch_accept_token``), then the next step's bitmask is filled in one call over a few threads
(:meth:`start_bitmask`, ``batch_fill_next_token_bitmask``) straight into a preallocated buffer, pinned on a GPU
engine. Both run in a worker thread beside the engine's Python work (the outputs of the step before and the plan
of the step after; xgrammar releases the GIL in both): the engine's async path defers the accept of every token
that cannot end its grammar (``accept_tokens(defer=True)``: all but stop tokens, as a token the bitmask allowed
is accepted) to that thread, which then fills the bitmask; the model runner copies it to the device
(``GrammarBitmask.to``: the thread makes no device call, whose Python would hold the GIL). The bitmask has a row
for each constrained sampling row only, over the grammar engine's vocabulary (the tokenizer's: ``num_tokens``), not the
logits' padded width; unconstrained rows are not copied and not masked (``bitmask.py``). Nothing per step is
proportional to the vocabulary on the host but the fill itself.

A step's bitmask needs the tokens of the step before (a matcher must hold every token of its request first):
with async scheduling the engine queues step k+1's forward pass, reads step k's tokens, has the worker advance
the matchers and fill step k+1's bitmask while the device runs that forward pass, then queues step k+1's
sampling (``engine/structured_steps.py``; vLLM defers the sampling of a step with structured-output requests the
same way).
"""

from __future__ import annotations

import os
import sys
import weakref

import numpy as np
import torch

from attnserve.core.step import SchedulerOutput
from attnserve.core.structured_outputs import StructuredOutputsParams
from attnserve.structured_output.bitmask import GrammarBitmask
from attnserve.structured_output.fill_worker import FillWorker

# at most (and half the process's cores): xgrammar's threads cost more than they split at a decode batch's size
# (the H200 machine, 64 rows under one schema: 0.29 ms a fill with 1 thread, 0.72 with 8; in the engine the
# engine thread's wait for the worker was 0.063 ms with 1 thread against 0.209 with 2; docs/benchmarks.md)
FILL_THREADS = 1
# Python's GIL switch interval (s) while a fill runs in the worker thread. At the default 5 ms a thread that wants
# the GIL back from a thread running Python waits up to 5 ms: the worker, between its xgrammar calls, would wait
# for the engine's thread to block on the result, and nothing would overlap (``benchmarks/grammar_overlap.py``;
# figures in docs/benchmarks.md).
FILL_SWITCH_INTERVAL = 1e-4


def fill_threads() -> int:
    """Threads of the bitmask fill: half the cores this process may run on, 1 to FILL_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(FILL_THREADS, cores // 2))


class PendingBitmask:
    """A step's bitmask while its fill may still run (:meth:`StructuredOutputManager.start_bitmask`)."""

    def __init__(
        self, bitmask: GrammarBitmask | None, filling: FillWorker | None = None, switch_interval: float | None = None
    ) -> None:
        self._bitmask = bitmask
        self._filling = filling  # the worker running this fill, until it is read
        self._switch_interval = switch_interval  # the GIL switch interval to restore once the fill is done

    def result(self) -> GrammarBitmask | None:
        """The bitmask, once filled (re-raises the fill's error); None when no sampling row is constrained.
        The deferred accepts that ran first are done then (:meth:`StructuredOutputManager.take_ended`)."""
        filling, self._filling = self._filling, None
        if filling is not None:
            try:
                filling.wait()
            finally:
                sys.setswitchinterval(self._switch_interval)
        return self._bitmask


class _Deferred:
    """Tokens whose accept waits for the next fill (``accept_tokens(defer=True)``): parallel lists."""

    __slots__ = ("ids", "matchers", "tokens")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.matchers: list = []
        self.tokens: list[int] = []


class StructuredOutputManager:
    """Grammar matchers of the constrained requests (by request id) and the host side of the bitmask.

    ``pin_memory``: the bitmask buffers are pinned (a GPU engine: the runner's copy then needs no host copy
    and does not wait)."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_token_id: int | None,
        pin_memory: bool = False,
    ) -> None:
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
        self._views: dict[tuple[int, int], tuple[torch.Tensor, np.ndarray]] = {}  # (turn, rows) -> _buffer's views
        self._worker: FillWorker | None = None  # the bitmask fill's thread, made on first use
        self._deferred = _Deferred()
        self._ended: list[str] = []  # ids whose deferred token ended their grammar (:meth:`take_ended`)

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

    def accept_tokens(self, tokens: list[tuple[str, int]], defer: bool = False) -> list[str]:
        """Advance each constrained request's matcher by its new token ((request id, token id) pairs; ids without
        a matcher are skipped); returns the ids whose grammar ended: terminated (the request ends, finish reason
        ``stop``), or the token rejected (only an EOS the request ignores, or a stop token id).

        ``defer``: only stop tokens, the ones that can end a grammar that allowed them, are accepted now; the
        others are accepted in the worker thread before the next :meth:`start_bitmask` fills (or by the next call
        that reads the matchers); an id among them that its token still ended comes from :meth:`take_ended`, or
        with the ids this call returns (deferred accepts still pending run first)."""
        self._accept_deferred()
        ended = self.take_ended()
        matchers = self.matchers
        ids, matched, toks = [], [], []
        stop = self.backend.stop_token_ids if defer else None
        later = self._deferred
        for rid, t in tokens:
            m = matchers.get(rid)
            if m is None:
                continue
            if stop is not None and t not in stop:
                later.ids.append(rid)
                later.matchers.append(m)
                later.tokens.append(t)
            else:
                ids.append(rid)
                matched.append(m)
                toks.append(t)
        if not ids:
            return ended
        return ended + [ids[i] for i in self.backend.accept(matched, toks)]

    def take_ended(self) -> list[str]:
        """The ids whose deferred token ended their grammar since the last call (rejected: a bitmask bug or a
        token the engine did not mask); the engine finishes each with its next token (finish reason ``stop``)."""
        ended, self._ended = self._ended, []
        return ended

    def _accept_deferred(self, deferred: _Deferred | None = None) -> None:
        """Accept ``deferred`` (default: the pending ones, taken); the ended ids go to :meth:`take_ended`."""
        if deferred is None:
            deferred, self._deferred = self._deferred, _Deferred()
        if deferred.ids:
            self._ended += [deferred.ids[i] for i in self.backend.accept(deferred.matchers, deferred.tokens)]

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
        """:meth:`bitmask`, begun: the deferred accepts and then the fill run in the manager's worker thread
        (xgrammar releases the GIL in both, so the caller's Python work runs beside them); its ``result()`` waits
        for them and gives the bitmask. The matchers must not change or go before then."""
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
        deferred, self._deferred = self._deferred, _Deferred()
        if not constrained:
            self._accept_deferred(deferred)
            return PendingBitmask(None)
        pinned, words = self._buffer(len(constrained))
        row_index = None if len(rows) == j else np.asarray(rows, dtype=np.int64)
        bitmask = GrammarBitmask(words, row_index, self.backend.vocab_size, j, pinned)
        if not in_thread:
            self._fill(deferred, constrained, words)
            return PendingBitmask(bitmask)
        if self._worker is None:
            self._worker = FillWorker()
            # a manager dropped without close() ends its thread too; not at exit, where a daemon thread that wakes
            # is ended mid-way by the interpreter's shutdown
            weakref.finalize(self, self._worker.stop).atexit = False
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, FILL_SWITCH_INTERVAL))  # restored by the result's reader
        self._worker.submit(lambda: self._fill(deferred, constrained, words))
        return PendingBitmask(bitmask, self._worker, interval)

    def close(self) -> None:
        """End the fill's thread (the engine's shutdown); a later fill starts another."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()

    def _fill(self, deferred: _Deferred, constrained: list, words: np.ndarray) -> None:
        """The worker's job: the deferred accepts, then the fill of ``words``."""
        self._accept_deferred(deferred)
        self._batch.batch_fill_next_token_bitmask(constrained, words)

    def _buffer(self, n: int) -> tuple[torch.Tensor, np.ndarray]:
        """Rows [0, n) of the next buffer in turn: (n, ceil(num_tokens / 32)) int32 on the host, and its numpy
        view (both kept for the next call of the same ``n``: a decode batch makes no new view per step)."""
        self._turn ^= 1
        view = self._views.get((self._turn, n))
        if view is not None:
            return view
        width = (self.backend.vocab_size + 31) // 32
        if len(self._buffers) < 2 or self._buffers[self._turn].shape[0] < n:
            size = max(n, 64, 2 * (self._buffers[0].shape[0] if self._buffers else 0))
            self._buffers = [
                torch.empty((size, width), dtype=torch.int32, pin_memory=self.pin_memory) for _ in range(2)
            ]
            self._views.clear()
        pinned = self._buffers[self._turn][:n]
        view = self._views[(self._turn, n)] = (pinned, pinned.numpy())
        return view
