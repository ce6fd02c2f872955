"""UniProcExecutor: one ModelRunner in the engine's process (tensor_parallel_size 1)."""

from __future__ import annotations

import gc

import torch

from attnserve.config.engine import EngineConfig
from attnserve.core.step import SchedulerOutput
from attnserve.executor.base import Executor, RunnerInfo
from attnserve.model_executor.loader import ModelSource
from attnserve.model_executor.model_runner import ModelRunner, ModelRunnerOutput, PendingStep, QueuedForward


class UniProcExecutor(Executor):
    def __init__(self, config: EngineConfig, hf_config, source: ModelSource) -> None:
        self.runner = ModelRunner(config, hf_config, source)
        self.info = RunnerInfo.of(self.runner)

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute(sched)

    def execute_async(self, sched: SchedulerOutput) -> PendingStep:
        return self.runner.execute_async(sched)

    def queue_forward(self, sched: SchedulerOutput) -> QueuedForward:
        """The step's forward pass queued, its sampling not yet (``ModelRunner.queue_forward``): the engine fills
        the step's grammar bitmask in between. Only this executor has it (workers sample in one call)."""
        return self.runner.queue_forward(sched)

    def shutdown(self) -> None:
        """Release the runner (weights, KV cache, CUDA graphs) and hand the allocator's cached blocks back to
        the GPU, so that another engine started in this process gets the memory. Idempotent; the executor
        runs nothing afterwards."""
        runner, self.runner = getattr(self, "runner", None), None
        if runner is None:
            return
        cuda = runner.device.type == "cuda"
        del runner
        gc.collect()  # the runner's cycles (modules, graphs) hold its tensors
        if cuda:
            torch.cuda.empty_cache()
