"""Log records held back while a check runs: logged once it passes, dropped when it refuses.

    with held_logs():
        preflight(config)   # raises: the caller's one error line is all the user sees

A check that passes keeps its log (``serve``'s "Using CPU_ATTN attention backend ..." line, which the engine's
own, cached, selection does not log again); one that refuses does not put log lines before its error line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _Holder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def held_logs() -> Iterator[None]:
    """Hold what the root logger's handlers would get in the block; hand it to them, in order, when the block
    returns, and drop it when the block raises."""
    root = logging.getLogger()
    handlers, holder = root.handlers[:], _Holder()
    root.handlers = [holder]
    try:
        yield
    finally:
        root.handlers = handlers
    for record in holder.records:
        for handler in handlers:
            if record.levelno >= handler.level:
                handler.handle(record)
