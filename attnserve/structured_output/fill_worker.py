"""FillWorker: the one thread that runs a step's grammar work (the deferred accepts, then the bitmask fill).

The engine's thread runs Python the whole step (the step is host-bound), so every time this thread needs the GIL
it takes it from the engine's thread: its Python between the GIL-free xgrammar calls costs the engine that time.
A ``ThreadPoolExecutor`` wakes through a queue and reports through a Future, a condition variable and an idle
semaphore, and after reporting it runs its loop's bookkeeping while the engine's thread is already sampling. Here
a job is handed over and reported by two plain locks: the thread wakes straight into the job and, once it has
released ``done``, blocks again (``benchmarks/gpu/bench_structured_tpot.py --variants json_pool`` compares the
two on the GPU).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class FillWorker:
    """A daemon thread running one job at a time: :meth:`submit`, then :meth:`wait` before the next submit."""

    def __init__(self, name: str = "attnserve-grammar") -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._job: Callable[[], None] | None = None
        self._error: BaseException | None = None
        self._busy = False  # a job submitted and not yet waited for
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        go, done = self._go, self._done
        while True:
            go.acquire()
            job = self._job
            if job is None:  # stop()
                return
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - re-raised on the engine's thread by wait()
                self._error = e
            job = None  # holds nothing (the manager) while it waits for the next one
            done.release()

    def submit(self, job: Callable[[], None]) -> None:
        """Start ``job`` on the thread. RuntimeError once closed, or while the last job is not waited for."""
        if self._closed:
            raise RuntimeError("FillWorker is closed")
        if self._busy:
            raise RuntimeError("FillWorker.submit before wait() of the last job")
        self._busy = True
        self._job = job
        self._go.release()

    def wait(self) -> None:
        """Block until the submitted job is done (at once when none is); re-raise its error."""
        if not self._busy:
            return
        self._done.acquire()
        self._busy = False
        self._job = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """End the thread (after the job in hand, if any) and join it; submit refuses afterwards."""
        try:
            self.wait()
        finally:
            self.stop()
            self._thread.join()

    def stop(self) -> None:
        """Tell an idle thread to end, without waiting for it (a finalizer's call); nothing while a job runs or
        once stopped."""
        if self._busy or self._closed:
            return
        self._closed = True
        self._job = None
        self._go.release()
