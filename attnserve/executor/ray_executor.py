"""RayExecutor: the same Worker per rank, as Ray actors (one GPU each on CUDA; one CPU each on CPU).

Uses the running Ray instance when there is one (``ray.init()`` by the caller, or ``RAY_ADDRESS``), else
starts a local one. Across hosts: ``ray start --head`` on one machine, ``ray start --address=HEAD:6379``
on the others, then run attnserve on the head with ``--distributed-executor-backend ray``; the process
group's rendezvous is rank 0's actor's node address. A dead actor fails the step with WorkerDiedError.
"""

from __future__ import annotations

import logging
import os

from attnserve.config.engine import EngineConfig
from attnserve.engine.scheduler import SchedulerOutput
from attnserve.executor.base import Executor, WorkerDiedError
from attnserve.executor.env import free_port, worker_env
from attnserve.executor.worker import Worker
from attnserve.model_executor.loader import ModelSource
from attnserve.model_executor.model_runner import ModelRunnerOutput
from attnserve.platforms import detect_platform

logger = logging.getLogger(__name__)

RAY_INSTALL = "pip install 'attnserve[ray]'"


class _Rendezvous:
    """Rank 0's host address and a free port there (runs on the node where rank 0's actor runs)."""

    def address(self) -> str:
        import ray

        host = ray.util.get_node_ip_address()
        return f"tcp://{host}:{free_port(host)}"


class RayExecutor(Executor):
    def __init__(self, config: EngineConfig, hf_config, source: ModelSource) -> None:
        try:
            import ray
        except ImportError:
            raise ImportError(f"distributed_executor_backend ray needs Ray; install it with: {RAY_INSTALL}") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(include_dashboard=False)
        n = config.parallel.tensor_parallel_size
        on_cpu = detect_platform(config.device).device_type == "cpu"
        # actors import the attnserve this process runs, wherever it was imported from
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        runtime_env = {"env_vars": {**worker_env(), "PYTHONPATH": path}}
        resources = {"num_cpus": 1} if on_cpu else {"num_gpus": 1, "num_cpus": 0}
        actor = ray.remote(Worker)
        probe = ray.remote(_Rendezvous).options(num_cpus=0, runtime_env=runtime_env).remote()
        self.failed: str | None = None
        self.workers = []
        init_method = self._get([probe.address.remote()])[0]
        ray.kill(probe)
        for rank in range(n):
            self.workers.append(actor.options(runtime_env=runtime_env, **resources).remote(
                config=config, hf_config=hf_config, source=source, rank=rank, world_size=n, local_rank=0,
                init_method=init_method, env=worker_env()))
        self.info = self._get([w.info.remote() for w in self.workers])[0]
        self.pids = self._get([w.pid.remote() for w in self.workers])
        logger.info("Tensor parallel: %d Ray actors (pids %s), %s", n, self.pids, self.info.backend_name)

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        if self.failed:
            raise WorkerDiedError(self.failed)
        return self._get([w.execute.remote(sched) for w in self.workers])[0]

    def _get(self, refs: list) -> list:
        """Results in order; the first failure (any rank) raises at once instead of waiting on the others."""
        ray = self.ray
        index = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                results[index[ready[0]]] = ray.get(ready[0])
            except ray.exceptions.RayError as e:
                rank = index[ready[0]]
                pid = self.pids[rank] if getattr(self, "pids", None) else "?"
                kind = "died" if isinstance(e, ray.exceptions.RayActorError) else "failed"
                self.failed = f"worker rank {rank} (pid {pid}, Ray actor) {kind}; pending requests failed: {e}"
                self.shutdown()
                raise WorkerDiedError(self.failed) from None
        return results

    def shutdown(self) -> None:
        if self.ray.is_initialized():  # after ray.shutdown() the actors are gone with their instance
            for w in getattr(self, "workers", []):
                self.ray.kill(w)
        self.workers = []
