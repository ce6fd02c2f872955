"""Pinned host buffers in rotating sets, for host-to-device copies that must not wait for the device.

FlashInfer's ``plan()`` reads its host arrays from them (the eager wrappers of
:mod:`attnserve.attention.backends.flashinfer`, the CUDA-graph re-plans of
:mod:`attnserve.attention.backends.flashinfer_graphs`).
"""

from __future__ import annotations

from typing import Any

import torch


class PinnedRing:
    """Pinned host buffers that asynchronous host-to-device copies read, in rotating sets.

    ``acquire()`` takes the next set, waiting (rarely) until the copies enqueued from it last time have run:
    a host that prepares step k+1 while the device still runs step k must not overwrite data a pending copy
    of step k has yet to read (FlashInfer's own planner reuses one pinned buffer per wrapper, which is safe
    only when every step ends with a host synchronisation). ``release()`` marks the end of a set's copies.
    """

    def __init__(self, cuda: bool = True, slots: int = 2) -> None:
        self.cuda = cuda  # False: plain host memory, no events (device-less tests)
        self._sets: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self._events: list[Any] = [None] * slots
        self._retired: list[torch.Tensor] = []  # outgrown buffers a pending copy may still read
        self._next = 0
        self._cur = 0

    def acquire(self) -> None:
        self._cur, self._next = self._next, (self._next + 1) % len(self._sets)
        event = self._events[self._cur]
        if event is not None and not event.query():
            event.synchronize()  # the device is more than one step behind: wait for that set's copies only

    def buffer(self, name: str, numel: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        """The current set's pinned buffer ``name``, its first ``numel`` entries."""
        bufs = self._sets[self._cur]
        buf = bufs.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            size = max(numel, 256)
            if buf is not None:
                self._retired.append(buf)
                size = max(size, 2 * buf.numel())  # grow geometrically: few retired buffers
            buf = torch.empty(size, dtype=dtype, pin_memory=self.cuda)
            bufs[name] = buf
        return buf[:numel]

    def reserve(self, name: str, numel: int, dtype: torch.dtype = torch.int32) -> None:
        """Allocate ``name`` in every set now (pinned allocations are slow: not in a replay)."""
        cur = self._cur
        for i in range(len(self._sets)):
            self._cur = i
            self.buffer(name, numel, dtype)
        self._cur = cur

    def release(self) -> None:
        if not self.cuda:
            return
        event = self._events[self._cur]
        if event is None:
            event = self._events[self._cur] = torch.cuda.Event()
        event.record()
