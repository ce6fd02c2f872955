"""Worker: one tensor-parallel rank (process or Ray actor): joins the process group, owns a ModelRunner.

Every rank receives the same SchedulerOutput each step and runs the same forward pass, the layers'
collectives meeting in lockstep; rank 0 also samples and returns the tokens.
"""

from __future__ import annotations

import dataclasses
import os
import traceback

import torch

from attnserve.config.engine import EngineConfig
from attnserve.distributed.group import TPGroup
from attnserve.engine.scheduler import SchedulerOutput
from attnserve.model_executor.loader import ModelSource
from attnserve.model_executor.model_runner import ModelRunnerOutput


class Worker:
    """One rank. ``local_rank`` picks the GPU on its host (Ray actors see one GPU: local_rank 0)."""

    def __init__(self, config: EngineConfig, hf_config, source: ModelSource, rank: int, world_size: int,
                 local_rank: int, init_method: str, env: dict[str, str]) -> None:
        os.environ.update(env)  # before the process group: NCCL reads its variables at communicator setup
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the host's cores
        from attnserve.platforms import detect_platform

        on_cpu = detect_platform(config.device).device_type == "cpu"
        if not on_cpu:
            torch.cuda.set_device(local_rank)
            config = dataclasses.replace(config, device=f"cuda:{local_rank}")
        import torch.distributed as dist

        dist.init_process_group("gloo" if on_cpu else "nccl", init_method=init_method, rank=rank,
                                world_size=world_size)
        from attnserve.model_executor.model_runner import ModelRunner

        self.rank = rank
        self.runner = ModelRunner(config, hf_config, source, TPGroup(rank, world_size))

    def info(self):
        from attnserve.executor.base import RunnerInfo

        return RunnerInfo.of(self.runner)

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput | None:
        out = self.runner.execute(sched)
        return out if self.rank == 0 else None

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def run_worker(conn, kwargs: dict) -> None:
    """Process entry (``spawn``): build the Worker, then serve steps from ``conn`` until None or EOF.

    Replies: ``("ready", RunnerInfo)`` once from every rank; per step ``("ok", output)`` from rank 0 only;
    ``("error", traceback)`` from any rank that fails (it then exits).
    """
    try:
        worker = Worker(**kwargs)
        conn.send(("ready", worker.info()))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            try:
                sched = conn.recv()
            except EOFError:  # the engine is gone
                break
            if sched is None:
                break
            out = worker.execute(sched)
            if worker.rank == 0:
                conn.send(("ok", out))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        worker.close()
