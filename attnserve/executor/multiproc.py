"""MultiprocExecutor: one spawned worker process per rank on this host, a pipe to each.

The engine (scheduler, detokenizer) stays in this process. Each step the SchedulerOutput is pickled once
and sent down every pipe (``execute_async``: the workers queue it at once); rank 0 answers with the sampled
tokens, one reply per step in step order, read by the step's handle (``result()``), so the engine can send
step k+1 before it reads step k's tokens (async scheduling). While waiting, the executor watches every
worker's pipe and process sentinel, so a worker that raises or dies (killed, out of memory) fails the step
at once with its rank, pid and exit code; the others are killed, since they would wait forever in a
collective with the dead one. A worker's ConfigError (a setting it refused) crosses the pipe with its key
(``WorkerError``) and is raised here as WorkerConfigError, as one process would raise it.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Collection
from multiprocessing import connection
from multiprocessing.reduction import ForkingPickler

import torch.multiprocessing as mp

from attnserve.config.engine import EngineConfig
from attnserve.core.step import SchedulerOutput
from attnserve.distributed.sharding import check_gpu_count
from attnserve.executor.base import Executor, StepReply, WorkerConfigError, WorkerDiedError
from attnserve.executor.env import environ, free_port, worker_env
from attnserve.executor.worker import WorkerError, run_worker
from attnserve.model_executor.loader import ModelSource
from attnserve.model_executor.model_runner import ModelRunnerOutput

logger = logging.getLogger(__name__)


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig, hf_config, source: ModelSource) -> None:
        n = config.parallel.tensor_parallel_size
        check_gpu_count(config.device, n)
        # spawn, never fork: this process may already hold a CUDA context (fork would copy it, broken) and
        # the engine's threads. Rank r uses GPU r of this host (cuda:r as CUDA_VISIBLE_DEVICES numbers them).
        ctx = mp.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{free_port()}"
        env = worker_env()
        self.procs, self.conns = [], []
        self.failed: str | None = None
        self._sent = 0  # steps sent (numbered 1, 2, ...); rank 0 replies to each, in order
        self._received = 0  # replies read
        for rank in range(n):
            parent, child = ctx.Pipe()
            kwargs = dict(
                config=config,
                hf_config=hf_config,
                source=source,
                rank=rank,
                world_size=n,
                local_rank=rank,
                init_method=init_method,
                env=env,
            )
            p = ctx.Process(target=run_worker, args=(child, kwargs), name=f"attnserve-tp{rank}", daemon=True)
            with environ(env):  # the worker starts with the NCCL variables, before it imports torch
                p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns)
        infos = self._wait(set(range(n)))
        self.info = infos[0]
        logger.info(
            "Tensor parallel: %d worker processes (pids %s), %s", n, [p.pid for p in self.procs], self.info.backend_name
        )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_async(sched).result()

    def execute_async(self, sched: SchedulerOutput) -> StepReply:
        """Send the step to every rank (each queues it) and return without waiting for its tokens."""
        if self.failed:
            raise WorkerDiedError(self.failed)
        data = ForkingPickler.dumps(sched)  # pickled once for all ranks; each worker's recv() unpickles it
        for rank, c in enumerate(self.conns):
            try:
                c.send_bytes(data)
            except (BrokenPipeError, ConnectionResetError, EOFError):
                # a dead process's pipe closes a moment before its exit can be reaped: name the exit code
                self.procs[rank].join(timeout=2)
                self._check_dead()
                self._fail(f"worker rank {rank} (pid {self.procs[rank].pid}) is unreachable")
        self._sent += 1
        return StepReply(self._reply, self._sent)

    def _reply(self, seq: int) -> ModelRunnerOutput:
        """Rank 0's reply to step ``seq``; replies of earlier steps nobody asked for are dropped."""
        if self.failed:
            raise WorkerDiedError(self.failed)
        if seq <= self._received:
            raise RuntimeError(f"the reply to step {seq} was dropped: a later step's reply was read first")
        while self._received < seq:
            payload = self._wait({0})[0]
            self._received += 1
        return payload

    def _wait(self, ranks: set[int]) -> dict:
        """Replies of ``ranks``; raises WorkerDiedError as soon as any worker errors or exits."""
        got: dict = {}
        watch = [*self.conns, *(p.sentinel for p in self.procs)]
        while len(got) < len(ranks):
            ready = connection.wait(watch)
            for rank, c in enumerate(self.conns):
                if c not in ready:
                    continue
                try:
                    kind, payload = c.recv()
                except (EOFError, ConnectionResetError):
                    # the pipe closes as its process dies, a moment before the exit can be reaped
                    self.procs[rank].join(timeout=2)
                    self._check_dead()
                    self._fail(f"worker rank {rank} (pid {self.procs[rank].pid}) closed its pipe")
                if kind == "error":
                    # a rank's error is often the echo of a peer that died (its collective lost the peer):
                    # give a dead peer a moment to be reaped and name it, the cause, instead; a rank that sent an
                    # error is no silent crash, whatever its exit code (gloo's threads may abort its exit), so the
                    # errors in every pipe are read first; else the rank that failed first
                    connection.wait([p.sentinel for r, p in enumerate(self.procs) if r != rank], timeout=1.0)
                    errors = self._collect_errors({rank: payload})
                    self._check_dead(crashed_only=True, sent_errors=errors)
                    self._fail_with_errors(errors)
                if rank in ranks:
                    got[rank] = payload
            self._check_dead()
        return got

    def _collect_errors(self, errors: dict[int, WorkerError]) -> dict[int, WorkerError]:
        """``errors`` with every other rank's error already in its pipe (by rank; the dict itself, filled)."""
        for rank, c in enumerate(self.conns):
            try:
                while rank not in errors and c.poll(0):
                    kind, payload = c.recv()
                    if kind == "error":
                        errors[rank] = payload
            except (EOFError, OSError):
                pass
        return errors

    def _fail_with_errors(self, errors: dict[int, WorkerError]):
        """Fail naming the rank whose error came first among ``errors`` (:meth:`_collect_errors`'), with its
        traceback; a ConfigError there is raised as WorkerConfigError, its message and key."""
        first = min(errors, key=lambda r: errors[r].time)
        others = sorted(r for r in errors if r != first)
        also = f" (then rank {', '.join(map(str, others))} too)" if others else ""
        error = errors[first]
        head = f"worker rank {first} (pid {self.procs[first].pid}) failed{also}; pending requests failed."
        message = f"{head} Its traceback:\n{error.traceback}"
        if error.key is not None and error.refusal is not None:  # a setting the rank refused: the error one process
            logger.debug("%s", message)  # would raise, keyed
            self._fail(message, WorkerConfigError(error.refusal))
        self._fail(message, WorkerDiedError(message, error.checkpoint_shape, f"{head} {error.exception_line}"))

    def _check_dead(self, crashed_only: bool = False, sent_errors: Collection[int] = ()) -> None:
        """Fail naming the first dead worker; ``crashed_only``: only one that did not exit cleanly (code 0 is
        a worker's exit after it sent an error) and is not among ``sent_errors`` (ranks whose error was read)."""
        for rank, p in enumerate(self.procs):
            if not p.is_alive():
                p.join(timeout=1)
                if crashed_only and (p.exitcode == 0 or rank in sent_errors):
                    continue
                self._fail(f"worker rank {rank} (pid {p.pid}) died (exit code {p.exitcode}); pending requests failed")

    def _fail(self, message: str, error: WorkerDiedError | None = None):
        """Stop every worker and raise ``error`` (default: WorkerDiedError(message)); later calls raise
        WorkerDiedError(message)."""
        self.failed = message
        _stop(self.procs, self.conns, graceful=False)
        raise error if error is not None else WorkerDiedError(message)

    def shutdown(self) -> None:
        self._finalizer()


GRACEFUL_EXIT_S = 30.0  # how long shutdown waits for workers to exit on their own before killing them


def _stop(procs, conns, graceful: bool = True) -> None:
    """Ask live workers to exit (graceful), then kill whatever is left. Only our own children."""
    if graceful:
        for p, c in zip(procs, conns):
            if p.is_alive():
                try:
                    c.send(None)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass
        # one deadline for all: a rank may need seconds to free its graphs, destroy its NCCL communicators
        # and stop torch.compile's worker pool (a FLEX_ATTENTION rank can take several seconds)
        deadline = time.monotonic() + GRACEFUL_EXIT_S
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    for c in conns:
        c.close()
