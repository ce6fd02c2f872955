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
            dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world_size,
                                    device_id=device)
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

        self.runner.release()  # CUDA graphs hold NCCL work: free them before the communicator goes
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
