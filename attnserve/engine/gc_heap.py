"""The live heap kept out of the garbage collector's full passes, as vLLM's EngineCore does after loading.

A full (generation 2) collection walks every tracked object: with a model, a tokenizer and hundreds of running
requests that pass stalls one engine step (none after a freeze; figure in docs/benchmarks.md).
Frozen objects that later become cyclic garbage are not collected until the heap is thawed: freeze only where
one engine lives for the process (the server), or around a timed loop (:func:`frozen_heap`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_heap() -> None:
    """Collect once, then move every object alive now into the permanent generation (``gc.freeze``)."""
    gc.collect()
    gc.freeze()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The heap frozen for the block (a benchmark's timed loop), thawed after it (``gc.unfreeze``), errors too."""
    freeze_heap()
    try:
        yield
    finally:
        gc.unfreeze()
