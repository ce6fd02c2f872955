"""The server's tokenizer work on one thread of its own, off the event loop.

Tokenizing a prompt costs CPU in proportion to its length: seconds for a 3 MB prompt. On the event loop that
would hold every other request, ``/health`` included, until it ends; on this thread the loop keeps answering
(a Hugging Face fast tokenizer releases the GIL while it encodes). Rendering a chat template and decoding a
token-id prompt for ``echo`` run here too.

One thread, not a pool: the tokenizer is one object that every request shares, and a fast tokenizer that one
thread reconfigures while another thread is inside its encode (which holds the Rust object while the GIL is
released) raises ``RuntimeError: Already borrowed``; transformers reconfigures it whenever a call asks for other
truncation or padding settings than those it holds, e.g. the first call after loading a ``tokenizer.json`` that
sets them. One at a time, the server's own calls cannot meet. The engine thread's detokenizer shares the object,
but it only decodes (nothing reconfigures it) and holds the GIL while it does, so a reconfiguration here, which
holds the GIL too, never runs inside one of its decodes. The cost: prompts are tokenized one after another, so a
text prompt waits for the ones that came before it, while requests with token ids (without ``echo``), generation
and every other route go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class TokenizerThread:
    """Runs functions that call the tokenizer on one worker thread, awaited from the event loop."""

    def __init__(self) -> None:
        # the thread starts with the first call
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnserve-tokenizer")

    async def run(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` on the tokenizer thread, after the calls submitted before it: its result, or the exception
        it raised (a request's 400 included). Cancelled while it waits for its turn, it does not run."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def shutdown(self) -> None:
        """Drop the calls still waiting; one in progress finishes on its thread, its result unused."""
        self._executor.shutdown(wait=False, cancel_futures=True)
