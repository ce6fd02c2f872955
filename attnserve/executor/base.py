"""The executor contract the engine steps through, the facts it reports, and the factory.

    executor = make_executor(config, hf_config, source)
    executor.info.num_blocks       # KV blocks every rank holds: the scheduler's budget
    executor.execute(sched)        # -> ModelRunnerOutput (rank 0's sampled tokens)
    executor.execute_async(sched)  # -> its .result() is that output (the step queued on every rank: async scheduling)
    executor.shutdown()

A dead or failed worker makes ``execute`` raise WorkerDiedError (and every later call too); it never hangs. A
worker that refused a setting (a ConfigError: its KV-cache budget, its device's attention backend) makes it
raise WorkerConfigError, that error's message and key, so that the CLI names the flag as with one process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnserve.config.engine import EngineConfig
from attnserve.config.fields import ConfigError
from attnserve.core.step import SchedulerOutput
from attnserve.model_executor.loader import ModelSource
from attnserve.model_executor.model_runner import ModelRunner, ModelRunnerOutput, PendingStep
from attnserve.refusals import Refusal


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker exited or raised; the message names its rank, pid and exit code or error (with the
    worker's traceback). ``checkpoint_shape``: the worker raised CheckpointShapeError (a checkpoint tensor of another
    shape). ``summary``: the message in one line, the traceback left out (its exception line kept)."""

    def __init__(self, message: str = "", checkpoint_shape: bool = False, summary: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint_shape = checkpoint_shape
        self.summary = summary if summary is not None else message


class WorkerConfigError(WorkerDiedError, ConfigError):
    """A tensor-parallel worker raised a ConfigError keyed to an engine argument (a setting it refused): the same
    refusal as that error in one process, so that callers name the flag (a ValueError, a ConfigError); the workers
    are stopped, as for any WorkerDiedError. The worker's rank and traceback are logged at debug level."""

    def __init__(self, refusal: Refusal) -> None:
        ConfigError.__init__(self, refusal)  # not RuntimeError's, first in the MRO: it would drop the record
        self.checkpoint_shape = False
        self.summary = str(self)


@dataclass(frozen=True)
class RunnerInfo:
    """What the engine, CLI and benchmarks read about the runner(s); rank 0's values under TP."""

    backend_name: str
    device: torch.device  # rank 0's device
    dtype: torch.dtype
    num_blocks: int
    num_layers: int
    num_kv_heads: int  # per rank
    head_size: int
    kv_dtype: torch.dtype
    weight_bytes: int  # weights one decode step reads on one rank (roofline)
    tensor_parallel_size: int = 1
    expert_bytes: int = 0  # of weight_bytes: the routed experts' (MoE models), with their count and k
    num_experts: int = 0
    experts_per_token: int = 0

    @classmethod
    def of(cls, runner: ModelRunner) -> "RunnerInfo":
        from attnserve.model_executor.weight_bytes import decode_weight_bytes, moe_expert_bytes

        return cls(
            runner.backend_name,
            runner.device,
            runner.dtype,
            runner.num_blocks,
            runner.num_layers,
            runner.num_kv_heads,
            runner.head_size,
            runner.kv_dtype,
            decode_weight_bytes(runner.model),
            runner.tp.size,
            *moe_expert_bytes(runner.model),
        )


class StepReply:
    """One step sent to worker processes or actors; ``result()`` fetches rank 0's reply to it (its sampled
    tokens) once, through ``fetch(seq)``. Replies are read in step order."""

    def __init__(self, fetch: Callable[[int], ModelRunnerOutput], seq: int) -> None:
        self._fetch = fetch
        self.seq = seq
        self._out: ModelRunnerOutput | None = None

    def result(self) -> ModelRunnerOutput:
        if self._out is None:
            self._out = self._fetch(self.seq)
        return self._out


class Executor(ABC):
    info: RunnerInfo

    @abstractmethod
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step on every rank; rank 0's sampled tokens."""

    def execute_async(self, sched: SchedulerOutput) -> PendingStep | ModelRunnerOutput:
        """Queue one step; ``.result()`` of the return value gives its sampled tokens. Results are read in
        step order (a handle left unread is skipped). Executors that cannot queue run the step here and
        return its output."""
        return self.execute(sched)

    def shutdown(self) -> None:
        """Stop workers (no-op in process)."""


def make_executor(config: EngineConfig, hf_config, source: ModelSource) -> Executor:
    """In process for one rank; else ``parallel.distributed_executor_backend``'s workers. Raises ValueError,
    before any worker starts, when the model's attention heads cannot be split over the ranks."""
    from attnserve.distributed.sharding import check_tensor_parallel_size

    check_tensor_parallel_size(hf_config, config.parallel.tensor_parallel_size)
    if config.parallel.tensor_parallel_size == 1:
        from attnserve.executor.uniproc import UniProcExecutor

        return UniProcExecutor(config, hf_config, source)
    if config.parallel.distributed_executor_backend == "ray":
        from attnserve.executor.ray_executor import RayExecutor

        return RayExecutor(config, hf_config, source)
    from attnserve.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(config, hf_config, source)
