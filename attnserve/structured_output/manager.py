"""StructuredOutputManager: the engine's grammar state: one matcher per constrained request, the step's bitmask.

The matchers live in the grammar process (``grammar_process.py``: a thread of this process slowed the engine's
Python while it filled); here each constrained request has a slot there, and its compiled grammar is sent once.
Per step: the step's new tokens advance the matchers in one batched call, then the next step's bitmask is filled
in one call straight into a shared buffer (pinned on a GPU engine), both in the grammar process while the engine's
thread makes the outputs of the step before and plans the step after. The engine's async path defers the accept
of every token that cannot end its grammar (``accept_tokens(defer=True)``: all but stop tokens, as a token the
bitmask allowed is accepted) to the next fill's message; the model runner copies the bitmask to the device
(``GrammarBitmask.to``). The bitmask has a row for each constrained sampling row only, over the grammar engine's
vocabulary (the tokenizer's: ``num_tokens``), not the logits' padded width; unconstrained rows are not copied and
not masked (``bitmask.py``). Nothing per step is proportional to the vocabulary on the engine's thread.

A step's bitmask needs the tokens of the step before (a matcher must hold every token of its request first):
with async scheduling the engine queues step k+1's forward pass, reads step k's tokens, has the grammar process
advance the matchers and fill step k+1's bitmask while the device runs that forward pass, then queues step k+1's
sampling (``engine/structured_steps.py``; vLLM defers the sampling of a step with structured-output requests the
same way).
"""

from __future__ import annotations

import weakref

import numpy as np

from attnserve.core.step import SchedulerOutput
from attnserve.core.structured_outputs import StructuredOutputsParams
from attnserve.structured_output.bitmask import GrammarBitmask
from attnserve.structured_output.grammar_process import GrammarProcess


class PendingBitmask:
    """A step's bitmask while its fill may still run (:meth:`StructuredOutputManager.start_bitmask`)."""

    def __init__(self, bitmask: GrammarBitmask | None, manager: StructuredOutputManager | None = None, ids=()) -> None:
        self._bitmask = bitmask
        self._manager = manager  # the manager whose fill this is, until it is read
        self._ids = ids  # request ids of the fill's deferred accepts, in order

    def result(self) -> GrammarBitmask | None:
        """The bitmask, once filled (GrammarProcessError for the grammar process's error); None when no sampling row
        is constrained. The deferred accepts that ran first are done then (:meth:`StructuredOutputManager.take_ended`)."""
        manager, self._manager = self._manager, None
        if manager is not None:
            manager._ended += [self._ids[i] for i in manager._process.wait()]
        return self._bitmask


class _Deferred:
    """Tokens whose accept waits for the next fill (``accept_tokens(defer=True)``): parallel lists."""

    __slots__ = ("ids", "slots", "tokens")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.slots: list[int] = []
        self.tokens: list[int] = []

    def add(self, request_id: str, slot: int, token: int) -> None:
        self.ids.append(request_id)
        self.slots.append(slot)
        self.tokens.append(token)

    def extend(self, other: _Deferred) -> _Deferred:
        """These, then ``other``'s (in place); returns self."""
        self.ids += other.ids
        self.slots += other.slots
        self.tokens += other.tokens
        return self

    def drop(self, slot: int) -> None:
        """Forget the tokens of ``slot``."""
        keep = [i for i, s in enumerate(self.slots) if s != slot]
        self.ids = [self.ids[i] for i in keep]
        self.slots = [self.slots[i] for i in keep]
        self.tokens = [self.tokens[i] for i in keep]


class StructuredOutputManager:
    """The constrained requests' matchers (by request id: their slot in the grammar process) and the host side of
    the bitmask.

    ``pin_memory``: the bitmask buffers are pinned (a GPU engine: the runner's copy then does not wait);
    ``max_rows``: the most sampling rows of a step (the scheduler's ``max_num_seqs``)."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_token_id: int | None,
        pin_memory: bool = False,
        max_rows: int = 256,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.pin_memory = pin_memory
        self.max_rows = max_rows
        self._backend = None  # made on first use: an engine without constrained requests needs no xgrammar
        self._process: GrammarProcess | None = None  # started by the first add
        self.matchers: dict[str, int] = {}
        self._free_slots: list[int] = []
        self._keys: dict[int, int] = {}  # id() of a compiled grammar (the backend caches it) -> its key there
        self._grammars: list = []  # the compiled grammars sent, held so that their ids stay theirs
        self._turn = 0
        self._deferred = _Deferred()
        self._ended: list[str] = []  # ids whose deferred token ended their grammar (:meth:`take_ended`)

    @property
    def backend(self):
        if self._backend is None:
            from attnserve.structured_output.backend_xgrammar import XgrammarBackend

            stop = [] if self.eos_token_id is None else [self.eos_token_id]
            self._backend = XgrammarBackend(self.tokenizer, self.vocab_size, stop)
        return self._backend

    @property
    def active(self) -> bool:
        """True while a constrained request is unfinished."""
        return bool(self.matchers)

    def compile(self, params: StructuredOutputsParams) -> None:
        """Compile (or find cached) the constraint: Refused for an invalid one, or for xgrammar missing."""
        self.backend.compile(params)

    def add(self, request_id: str, params: StructuredOutputsParams) -> None:
        compiled = self.backend.compile(params)
        process = self._process
        if process is None:
            width = (self.backend.vocab_size + 31) // 32
            process = self._process = GrammarProcess(
                self.backend.tokenizer_info_json(), self.max_rows, width, self.pin_memory
            )
            # a manager dropped without close() ends its process too
            weakref.finalize(self, process.close)
        key = self._keys.get(id(compiled))
        if key is None:
            key = self._keys[id(compiled)] = len(self._grammars)
            self._grammars.append(compiled)
            process.grammar(key, compiled)
        slot = self.matchers.get(request_id)
        if slot is None:
            slot = self._free_slots.pop() if self._free_slots else len(self.matchers)
            self.matchers[request_id] = slot
        process.add(slot, key)

    def remove(self, request_id: str) -> None:
        slot = self.matchers.pop(request_id, None)
        if slot is not None:
            if slot in self._deferred.slots:  # its deferred token must not reach the slot's next request
                self._deferred.drop(slot)
            self._process.remove(slot)
            self._free_slots.append(slot)

    def accept_tokens(self, tokens: list[tuple[str, int]], defer: bool = False) -> list[str]:
        """Advance each constrained request's matcher by its new token ((request id, token id) pairs; ids without
        a matcher are skipped); returns the ids whose grammar ended: terminated (the request ends, finish reason
        ``stop``), or the token rejected (only an EOS the request ignores, or a stop token id).

        ``defer``: only stop tokens, the ones that can end a grammar that allowed them, are accepted now; the
        others are accepted in the grammar process before the next :meth:`start_bitmask` fills (or by the next call
        that accepts now); an id among them that its token still ended comes from :meth:`take_ended`, or with the
        ids this call returns (deferred accepts still pending run first)."""
        matchers, pending, now = self.matchers, self._deferred, _Deferred()
        stop = self.backend.stop_token_ids if defer else None
        for rid, t in tokens:
            slot = matchers.get(rid)
            if slot is not None:
                (pending if stop is not None and t not in stop else now).add(rid, slot, t)
        if pending.ids and (now.ids or not defer):  # the pending accepts go first; a call that defers none runs them
            self._deferred, now = _Deferred(), pending.extend(now)
        ended = self.take_ended()
        if not now.ids:
            return ended
        return ended + [now.ids[i] for i in self._process.accept(now.slots, now.tokens)]

    def take_ended(self) -> list[str]:
        """The ids whose deferred token ended their grammar since the last call (rejected: a bitmask bug or a
        token the engine did not mask); the engine finishes each with its next token (finish reason ``stop``)."""
        ended, self._ended = self._ended, []
        return ended

    def has_unfinished(self, requests: dict) -> bool:
        """True while a constrained request is unfinished (``requests``: the scheduler's, by id), counting those
        that ended but whose matcher is not yet dropped as finished."""
        return any(rid in requests and not requests[rid].is_finished for rid in self.matchers)

    def bitmask(self, sched: SchedulerOutput) -> GrammarBitmask | None:
        """The step's bitmask over its constrained sampling rows (sampling rows: the scheduled requests that
        sample, in schedule order); None when no sampling row is constrained. ``words`` is a view of a reused
        buffer: valid until the call after next."""
        return self.start_bitmask(sched).result()

    def start_bitmask(self, sched: SchedulerOutput) -> PendingBitmask:
        """:meth:`bitmask`, begun: the deferred accepts and then the fill run in the grammar process while the
        caller goes on; its ``result()`` waits for them and gives the bitmask. Read it before the next call that
        accepts or fills."""
        matchers = self.matchers
        rows, slots = [], []
        j = 0
        for r in sched.requests:
            if r.samples:
                slot = matchers.get(r.request_id)
                if slot is not None:
                    rows.append(j)
                    slots.append(slot)
                j += 1
        deferred, self._deferred = self._deferred, _Deferred()
        if not slots:
            if deferred.ids:
                self._ended += [deferred.ids[i] for i in self._process.accept(deferred.slots, deferred.tokens)]
            return PendingBitmask(None)
        process = self._process
        self._turn ^= 1
        n = len(slots)
        process.start_fill(deferred.slots, deferred.tokens, slots, self._turn)
        words = process.buffers[self._turn, :n]
        pinned = None if process.pinned is None else process.pinned[self._turn, :n]
        row_index = None if n == j else np.asarray(rows, dtype=np.int64)
        return PendingBitmask(GrammarBitmask(words, row_index, self.backend.vocab_size, j, pinned), self, deferred.ids)

    def close(self) -> None:
        """End the grammar process (the engine's shutdown); a later add starts another."""
        process, self._process = self._process, None
        if process is not None:
            process.close()
        self.matchers.clear()
        self._free_slots.clear()
        self._keys.clear()
        self._grammars.clear()
        self._deferred = _Deferred()
