"""StructuredOutputManager: the engine's grammar state: one matcher per constrained request, the step's bitmask.

A step's bitmask is ``(R, ceil(V / 32))`` int32 over the step's R sampling rows (in the order the model runner
samples them: the scheduled requests that sample, in schedule order); bit ``t % 32`` of word ``t // 32`` set means
token ``t`` is allowed. Rows of unconstrained requests are all ones. A matcher must hold every token of its request
before the step's mask is filled: the engine reads the step in flight first (``LLMEngine.step``).
"""

from __future__ import annotations

import numpy as np

from attnserve.core.step import SchedulerOutput
from attnserve.core.structured_outputs import StructuredOutputsParams


class StructuredOutputManager:
    """Grammar matchers of the constrained requests (by request id) and the host side of the bitmask."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self._backend = None  # made on first use: an engine without constrained requests needs no xgrammar
        self._filler = None
        self.matchers: dict[str, object] = {}
        self._buffer = np.empty((0, 0), dtype=np.int32)

    @property
    def backend(self):
        if self._backend is None:
            from attnserve.structured_output.backend_xgrammar import XgrammarBackend

            stop = [] if self.eos_token_id is None else [self.eos_token_id]
            self._backend = XgrammarBackend(self.tokenizer, self.vocab_size, stop)
            self._filler = self._backend.batch_filler()
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

    def accept(self, request_id: str, token_id: int) -> bool:
        """Advance the request's matcher by its new token; True when the grammar has terminated (the request
        ends, finish reason ``stop``). A token the grammar rejects (only an EOS the request ignores, or a stop
        token id) also ends it."""
        m = self.matchers.get(request_id)
        if m is None:
            return False
        return not m.accept_token(token_id) or m.is_terminated()

    def bitmask(self, sched: SchedulerOutput) -> np.ndarray | None:
        """The step's ``(R, ceil(V/32))`` int32 bitmask over its sampling rows; None when no sampling row is
        constrained. A view of a reused buffer: valid until the next call."""
        rows = [r.request_id for r in sched.requests if r.samples]
        constrained = [(j, self.matchers[rid]) for j, rid in enumerate(rows) if rid in self.matchers]
        if not constrained:
            return None
        width = (self.vocab_size + 31) // 32
        if self._buffer.shape[0] < len(rows) or self._buffer.shape[1] != width:
            self._buffer = np.empty((max(len(rows), 2 * self._buffer.shape[0]), width), dtype=np.int32)
        mask = self._buffer[: len(rows)]
        if len(constrained) < len(rows):
            mask.fill(-1)  # unconstrained rows: every token allowed
        self._filler.batch_fill_next_token_bitmask([m for _, m in constrained], mask, [j for j, _ in constrained])
        return mask
