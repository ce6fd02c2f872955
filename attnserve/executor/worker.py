"""Worker: one tensor-parallel rank (process or Ray actor): joins the process group, owns a ModelRunner.

Every rank receives the same SchedulerOutput each step and runs the same forward pass, the layers'
collectives meeting in lockstep; rank 0 also samples and returns the tokens.

Steps are queued, never waited for, by the loop that receives them (``ModelRunner.execute_async``): a worker
queues step k+1 on its device while step k still runs. Rank 0's replies (each step's tokens, in step order)
are sent by a reply thread in a spawned worker, by ``take_step(seq)`` calls in a Ray actor.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import torch

from attnserve.config.engine import EngineConfig
from attnserve.config.fields import ConfigError
from attnserve.layers.linear import CheckpointShapeError
from attnserve.refusals import Refusal
from attnserve.distributed.group import TPGroup
from attnserve.core.step import SchedulerOutput
from attnserve.model_executor.loader import ModelSource
from attnserve.model_executor.model_runner import ModelRunnerOutput, PendingStep


class Worker:
    """One rank. ``local_rank`` picks the GPU on its host (Ray actors see one GPU: local_rank 0)."""

    def __init__(
        self,
        config: EngineConfig,
        hf_config,
        source: ModelSource,
        rank: int,
        world_size: int,
        local_rank: int,
        init_method: str,
        env: dict[str, str],
    ) -> None:
        os.environ.update(env)  # before the process group: NCCL reads its variables at communicator setup
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the host's cores
        # not detect_platform(config.device): a Ray actor sees one GPU, whatever cuda:N the config names
        on_cpu = config.device == "cpu" or not torch.cuda.is_available()
        import torch.distributed as dist

        if on_cpu:
            dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
        else:
            # this rank's GPU first: NCCL (and all_gather_object's tensors) use the current device; device_id
            # binds the process group to it and sets up the communicator now, so that a bad setup fails here
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            config = dataclasses.replace(config, device=str(device))
            dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world_size, device_id=device)
        from attnserve.model_executor.model_runner import ModelRunner

        tp = TPGroup(rank, world_size)
        # mp only: Ray actors see one GPU each and may sit on different hosts, where peer memory does not reach
        # (and the setup's failure path is untested there): NCCL
        if (
            not on_cpu
            and world_size > 1
            and not config.parallel.disable_custom_all_reduce
            and config.parallel.distributed_executor_backend == "mp"
        ):
            from attnserve.distributed.symm_mem_all_reduce import SymmMemAllReduce

            # collective (every rank or none gets one); None, after a warning line, on any setup failure
            tp = TPGroup(rank, world_size, SymmMemAllReduce.create(tp, torch.device(config.device)))
        self.rank = rank
        self.runner = ModelRunner(config, hf_config, source, tp)
        self._queued: collections.deque[tuple[int, PendingStep]] = collections.deque()  # rank 0, Ray: take_step()

    def info(self):
        from attnserve.executor.base import RunnerInfo

        return RunnerInfo.of(self.runner)

    def execute_async(self, sched: SchedulerOutput) -> PendingStep:
        """Queue one step on this rank's device; rank 0's result() gives the tokens (other ranks: none)."""
        return self.runner.execute_async(sched)

    def queue_step(self, sched: SchedulerOutput, seq: int) -> None:
        """Ray: queue step ``seq`` (numbered 1, 2, ... by the executor); rank 0 keeps it for :meth:`take_step`."""
        pending = self.runner.execute_async(sched)
        if self.rank == 0:
            self._queued.append((seq, pending))

    def take_step(self, seq: int) -> ModelRunnerOutput:
        """Ray, rank 0: wait for step ``seq``'s tokens. Earlier queued steps nobody asked for are dropped."""
        while self._queued:
            queued_seq, pending = self._queued.popleft()
            if queued_seq == seq:
                return pending.result()
        raise RuntimeError(f"step {seq} is not queued on rank 0")

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        import torch.distributed as dist

        self.runner.release()  # CUDA graphs hold NCCL work: free them before the communicator goes
        if dist.is_initialized():
            dist.destroy_process_group()


@dataclass(frozen=True)
class WorkerError:
    """A failing rank's error as it crosses to the engine's process (the exception itself may not unpickle
    there, and its traceback would not cross)."""

    time: float
    """When (wall clock): the executor names the rank that failed first."""
    traceback: str
    message: str
    """``str()`` of the exception."""
    key: str | None = None
    """For a ConfigError (a setting this rank refused: its KV-cache budget, its device's attention backend), the
    engine argument it is keyed to: the engine raises it as WorkerConfigError, for the CLI to name the flag."""
    refusal: Refusal | None = None
    """That ConfigError's record."""
    checkpoint_shape: bool = False
    """The rank raised CheckpointShapeError: the engine may convert a stale cached GGUF config again."""
    exception_line: str = ""
    """The traceback's last line, ``ValueError: bad heads``: a one-line summary names the error by it."""


def _error() -> tuple[str, WorkerError]:
    """The message of a failing rank: ``("error", WorkerError)`` of the exception being handled."""
    e = sys.exc_info()[1]
    refusal = e.refusal if isinstance(e, ConfigError) else None
    return "error", WorkerError(
        time.time(),
        traceback.format_exc(),
        str(e),
        refusal.setting if refusal else None,
        refusal,
        isinstance(e, CheckpointShapeError),
        " ".join("".join(traceback.format_exception_only(e)).split()),
    )


class _Replies:
    """Rank 0's replies to the engine, sent in step order by a thread: it waits for each queued step's tokens
    while the worker's loop receives and queues the next steps. ``send`` is shared with that loop (errors)."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.failed = False
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="attnserve-replies", daemon=True)
        self._thread.start()

    def put(self, pending: PendingStep) -> None:
        self._queue.put(pending)

    def send(self, message) -> None:
        with self._lock:
            try:
                self.conn.send(message)
            except (BrokenPipeError, ConnectionResetError, OSError):  # the engine is gone
                pass

    def close(self) -> None:
        """Send the replies still queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (pending := self._queue.get()) is not None:
            try:
                out = pending.result()
            except BaseException:
                self.failed = True
                self.send(_error())
                return
            self.send(("ok", out))


def run_worker(conn, kwargs: dict) -> None:
    """Process entry (``spawn``): build the Worker, then queue steps from ``conn`` until None or EOF.

    Replies: ``("ready", RunnerInfo)`` once from every rank; per step ``("ok", output)`` from rank 0 only, in
    step order (its reply thread); ``("error", WorkerError)`` from any rank that fails (it then exits).
    """
    try:
        worker = Worker(**kwargs)
        conn.send(("ready", worker.info()))
    except BaseException:
        conn.send(_error())
        return
    replies = _Replies(conn)
    try:
        while not replies.failed:
            try:
                sched = conn.recv()
            except EOFError:  # the engine is gone
                break
            if sched is None:
                break
            pending = worker.execute_async(sched)  # queued: step k+1 starts before step k's tokens are read
            if worker.rank == 0:
                replies.put(pending)
    except BaseException:
        replies.send(_error())
    finally:
        replies.close()
        worker.close()
