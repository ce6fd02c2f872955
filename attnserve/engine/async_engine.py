"""AsyncLLMEngine: the synchronous LLMEngine behind an asyncio interface, for the server.

One background thread owns the engine: it builds it, steps it, and is the only caller of its methods
(the engine is not thread-safe). The event loop hands work over through a thread-safe command queue
(add, abort, shut down, stop) and receives each request's outputs through its own ``RequestOutputCollector``
(``output_collector.py``): one slot whose newest output replaces the one not yet read, so a reader that falls
behind costs one pending output, and the loop never blocks on a model step.

Shutdown: ``begin_shutdown`` refuses new requests at once and, after an optional drain period, aborts the
unfinished ones between two steps; an aborted request's stream ends with a final output whose unfinished
completions have finish_reason "abort". ``shutdown`` then stops the thread and the executor's workers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from attnserve.config.engine import EngineConfig
from attnserve.config.fields import ConfigError
from attnserve.engine.llm_engine import LLMEngine
from attnserve.engine.output_collector import RequestOutputCollector
from attnserve.engine.outputs import RequestOutput
from attnserve.core.sampling_params import SamplingParams
from attnserve.executor.base import WorkerDiedError
from attnserve.refusals import serving as words

logger = logging.getLogger(__name__)


class EngineNotReadyError(RuntimeError):
    """The engine is still loading, failed to load, or is shutting down."""


class EngineDeadError(RuntimeError):
    """A model step raised; the requests in that step were failed."""


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load, taken by the engine thread after every step (read by /metrics)."""

    num_running: int = 0  # sequences (each of a request's n completions counts once)
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_blocks: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache since start
    prefix_cache_hits: int = 0  # of those, tokens found cached
    num_preemptions: int = 0  # requests preempted (their blocks freed, recomputed later) since start

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def kv_cache_usage(self) -> float:
        return 0.0 if self.num_blocks == 0 else 1.0 - self.num_free_blocks / self.num_blocks


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    stream: RequestOutputCollector


@dataclass
class _Abort:
    request_id: str


@dataclass
class _ResetPrefixCache:
    done: concurrent.futures.Future  # set to the number of cached blocks dropped


class _Stop:
    pass


@dataclass
class _Shutdown:
    abort_at: float  # time.monotonic() from which the unfinished requests are aborted


class AsyncLLMEngine:
    """Runs an LLMEngine on a background thread; ``generate`` yields a request's outputs as they come."""

    def __init__(self, config: EngineConfig, engine_factory: Callable[[EngineConfig], LLMEngine] = LLMEngine) -> None:
        self.config = config
        self._factory = engine_factory
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestOutputCollector] = {}  # owned by the engine thread
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._abort_at: float | None = None  # engine thread: set once shutdown began
        self._aborted_all = False  # engine thread: the shutdown's abort happened (and was logged)
        self.engine: LLMEngine | None = None
        self.load_error: BaseException | None = None
        # called on the engine thread once loading failed (the server then exits: a supervisor restarts it)
        self.on_load_error: Callable[[BaseException], None] | None = None
        # a worker died (WorkerDiedError): every later step would fail the same way, so no new requests
        self.dead_error: BaseException | None = None
        self.stats = EngineStats()  # replaced whole by the engine thread (an atomic reference swap)

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread, which loads the model then serves commands. Returns at once."""
        assert self._thread is None, "start() called twice"
        # daemon: a process told to exit while the model is still loading must not wait for the load
        self._thread = threading.Thread(target=self._run, name="attnserve-engine", daemon=True)
        self._thread.start()

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set() and self.load_error is None and self.dead_error is None and not self._stopping

    @property
    def is_loaded(self) -> bool:
        """The model loaded and no worker died (requests run, or ran until shutdown began)."""
        return self._ready.is_set() and self.load_error is None and self.dead_error is None

    @property
    def is_stopping(self) -> bool:
        """Shutdown began: new requests are refused."""
        return self._stopping

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the model is loaded; raise its load error if loading failed."""
        await asyncio.to_thread(self._ready.wait, timeout)
        if self.load_error is not None:
            raise self.load_error

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Refuse new requests, abort the unfinished ones and stop the thread (waits up to ``timeout`` for the
        step in progress to end), then stop the executor's tensor-parallel workers, within the executor's own
        deadline (they used to be stopped only by a finalizer at interpreter exit)."""
        self._stopping = True
        self._commands.put(_Stop())
        if self._thread is not None and self._ready.is_set():
            await asyncio.to_thread(self._thread.join, timeout)
            if not self._thread.is_alive() and self.engine is not None:  # the thread that owned it has ended
                await asyncio.to_thread(self.engine.shutdown)

    # --- requests --------------------------------------------------------------------------------
    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its newest RequestOutput after each step that changed it (a reader that
        falls behind gets the newest one, the steps it missed merged: ``output_collector.py``), the last one
        with ``finished=True`` (finish_reason "abort" when shutdown aborted it). Raises the engine's error
        for a rejected prompt (PromptTooLongError, ValueError), EngineNotReadyError once shutdown began.
        Leaving the iteration early (a disconnected client, a cancelled task) aborts the request, which
        frees its KV blocks."""
        if not self.is_ready:
            if self.dead_error is not None:
                raise EngineNotReadyError(words.engine_dead(self.dead_error))
            raise EngineNotReadyError(words.STILL_LOADING if not self._stopping else words.SHUTTING_DOWN)
        stream = RequestOutputCollector(asyncio.get_running_loop())
        self._commands.put(_Add(request_id, prompt, params, stream))
        finished = False
        try:
            while not finished:
                try:
                    item = await stream.get()
                except asyncio.CancelledError:
                    raise
                except BaseException:
                    finished = True  # the engine thread has already dropped the request
                    raise
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    @property
    def drained(self) -> bool:
        """Shutdown began (the engine thread has taken ``begin_shutdown``'s command, so no request is added any
        more) and no request is left: every one finished or was aborted. Read from any thread."""
        return self._abort_at is not None and not self._streams

    def abort(self, request_id: str) -> None:
        """Abort a request (frees its KV blocks); a no-op when it has finished. Thread-safe."""
        self._commands.put(_Abort(request_id))

    async def reset_prefix_cache(self) -> int:
        """Forget every cached prompt prefix, on the engine thread between steps; returns how many blocks were
        cached. Raises EngineNotReadyError before the model has loaded."""
        if self.engine is None or not self._ready.is_set():
            raise EngineNotReadyError(words.MODEL_STILL_LOADING)
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(_ResetPrefixCache(done))
        return await asyncio.wrap_future(done)

    def begin_shutdown(self, drain_timeout: float = 0.0) -> None:
        """Refuse new requests from now on; let the unfinished ones run for up to ``drain_timeout`` seconds,
        then abort them (0: at once, before the next step). Each aborted stream ends with a final output
        (finish_reason "abort"); one log line says how many were aborted. Returns at once; thread-safe and
        safe in a signal handler (a flag and a SimpleQueue put)."""
        self._stopping = True
        self._commands.put(_Shutdown(time.monotonic() + drain_timeout))

    # --- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            t0 = time.monotonic()
            self.engine = self._factory(self.config)
            logger.info("engine ready in %.1f s", time.monotonic() - t0)
        except BaseException as e:  # the server answers 503 with the reason, then exits (on_load_error)
            if isinstance(e, ConfigError) and e.key is not None:  # a setting refused, not a bug: no traceback
                logger.error("engine failed to load: %s", e)
            else:
                logger.exception("engine failed to load")
            self.load_error = e
            self._ready.set()
            if self.on_load_error is not None:
                self.on_load_error(e)
            return
        self._snapshot()
        self._ready.set()
        while True:
            # block only while idle; while requests run, take what has arrived and step again
            if not self._drain(block=not self.engine.has_unfinished_requests()):
                break
            if not self._aborted_all and self._abort_at is not None and time.monotonic() >= self._abort_at:
                self._abort_all()
            if self.engine.has_unfinished_requests():
                self._step()
        if not self._aborted_all:
            self._abort_all()
        self._snapshot()

    def _drain(self, block: bool) -> bool:
        """Apply queued commands; False once told to stop."""
        while True:
            try:
                cmd = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(cmd, _Stop):
                return False
            if isinstance(cmd, _Abort):
                self._abort(cmd.request_id)
            elif isinstance(cmd, _ResetPrefixCache):
                cmd.done.set_result(self.engine.reset_prefix_cache())
            elif isinstance(cmd, _Shutdown):
                self._abort_at = cmd.abort_at if self._abort_at is None else min(self._abort_at, cmd.abort_at)
            elif isinstance(cmd, _Add):
                if self._abort_at is not None:  # queued just before shutdown began: refused as a new request
                    cmd.stream.put(EngineNotReadyError(words.SHUTTING_DOWN))
                    continue
                try:
                    self.engine.add_request(cmd.prompt, cmd.params, cmd.request_id)
                    self._streams[cmd.request_id] = cmd.stream
                except Exception as e:  # a rejected prompt: the caller raises it
                    cmd.stream.put(e)
            self._snapshot()

    def _abort(self, request_id: str) -> None:
        """Abort a request; its stream (if still read) ends with the final output, finish_reason "abort"."""
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(self.engine.abort_request(request_id))

    def _abort_all(self) -> None:
        """Shutdown: abort every unfinished request, once, and log how many there were."""
        n = len(self._streams)
        for request_id in list(self._streams):
            self._abort(request_id)
        self._aborted_all = True
        logger.info("shutting down: aborted %d request%s in flight", n, "" if n == 1 else "s")

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            # fail every request in flight rather than the server: abort them all (frees their blocks)
            logger.exception("engine step failed; aborting %d requests", len(self._streams))
            if isinstance(e, WorkerDiedError):
                self.dead_error = e
            for request_id, stream in list(self._streams.items()):
                self._streams.pop(request_id)
                try:
                    self.engine.abort_request(request_id)
                except Exception:  # the engine's state may be what broke; the request is failed anyway
                    logger.exception("abort of %s failed", request_id)
                stream.put(EngineDeadError(words.step_failed(e)))
            self._snapshot()
            return
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            # no copy: the collector records the lists' lengths now and copies only what its reader takes
            stream.put(out)
        self._snapshot()

    def _snapshot(self) -> None:
        e = self.engine
        self.stats = EngineStats(
            num_running=len(e.scheduler.running),
            num_waiting=len(e.scheduler.waiting),
            num_free_blocks=e.block_manager.num_free_blocks,
            num_blocks=e.block_manager.num_blocks,
            prefix_cache_queries=e.scheduler.prefix_cache_stats.queries,
            prefix_cache_hits=e.scheduler.prefix_cache_stats.hits,
            num_preemptions=e.scheduler.num_preemptions,
        )
