"""RequestOutputCollector: one request's outputs handed from the engine thread to its reader on the event loop.

One slot, as vLLM's ``RequestOutputCollector`` (``v1/engine/output_processor.py``): the engine thread's output
replaces the one the reader has not taken yet, so a reader that falls behind (a client that stops reading its
stream) holds one pending output, not one per step. attnserve's outputs are cumulative (each holds the text
and tokens so far), so the newest output is the merge of the pending ones; ``text_delta`` and
``num_new_tokens`` of what the reader gets count from the output it took before. Memory per request: O(its
output), whatever the reader does.

No copies per step: the engine thread puts the output whose completions share the engine's growing token and
logprob lists, with their lengths at that step; the reader's output carries the collector's own lists, extended
from the engine's up to those lengths when it takes it (O(new tokens)). As with the engine's lists, they grow
when the reader takes its next output: read them before that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from attnserve.engine.outputs import CompletionOutput, RequestOutput


class RequestOutputCollector:
    """The hand-off of one request's outputs: ``put`` on the engine thread, ``get`` on ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        # the output not yet taken, with each completion's (tokens, logprobs) lengths when it was put; or the
        # exception that ends the request (it replaces any output and is never replaced)
        self._pending: tuple[RequestOutput, list[tuple[int, int]]] | BaseException | None = None
        self._ready = asyncio.Event()  # touched on the loop only
        # the reader's lists, per completion index, and how much text it was given
        self._token_ids: dict[int, list[int]] = {}
        self._logprobs: dict[int, list] = {}
        self._text_len: dict[int, int] = {}

    def put(self, item: RequestOutput | BaseException) -> None:
        """Hand over the engine's newest output (or an error). Engine thread; never blocks."""
        if isinstance(item, RequestOutput):
            record = (
                item,
                [(len(c.token_ids), len(c.logprobs) if c.logprobs is not None else 0) for c in item.outputs],
            )
        else:
            record = item
        with self._lock:
            wake = self._pending is None
            if not isinstance(self._pending, BaseException):
                self._pending = record
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    async def get(self) -> RequestOutput:
        """The newest output (the pending ones merged); raises the error put instead. Event loop."""
        while True:
            with self._lock:
                pending, self._pending = self._pending, None
                if pending is None:
                    self._ready.clear()
            if pending is not None:
                break
            await self._ready.wait()
        if isinstance(pending, BaseException):
            raise pending
        out, lengths = pending
        return dataclasses.replace(out, outputs=[self._view(c, n, m) for c, (n, m) in zip(out.outputs, lengths)])

    def _view(self, c: CompletionOutput, num_tokens: int, num_logprobs: int) -> CompletionOutput:
        """``c`` with the collector's lists, extended to ``num_tokens`` / ``num_logprobs`` from the engine's."""
        ids = self._token_ids.setdefault(c.index, [])
        had = len(ids)
        ids.extend(c.token_ids[had:num_tokens])
        logprobs = None
        if c.logprobs is not None:
            logprobs = self._logprobs.setdefault(c.index, [])
            logprobs.extend(c.logprobs[len(logprobs) : num_logprobs])
        sent = self._text_len.get(c.index, 0)
        self._text_len[c.index] = len(c.text)
        return CompletionOutput(
            c.index,
            c.text,
            ids,
            c.finish_reason,
            c.stop_reason,
            logprobs,
            c.text[sent:],
            num_tokens - had,
            c.cumulative_logprob,
        )
