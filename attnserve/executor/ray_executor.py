"""RayExecutor: the same Worker per rank, as Ray actors (one GPU each on CUDA; one CPU each on CPU).

Uses the running Ray instance when there is one (``ray.init()`` by the caller, or ``RAY_ADDRESS``), else
starts a local one. Across hosts: ``ray start --head`` on one machine, ``ray start --address=HEAD:6379``
on the others, then run attnserve on the head with ``--distributed-executor-backend ray``; the process
group's rendezvous is rank 0's actor's node address. A dead actor fails the step with WorkerDiedError; an actor's
ConfigError (a setting it refused) is raised as WorkerConfigError, its message and key.

Each step is put in the object store once and queued on every actor (``Worker.queue_step``, which returns once its
device has the step queued); its handle's ``result()`` asks rank 0's actor for the tokens (``Worker.take_step``).
An actor runs its calls in the order this process submits them, so the engine's order (queue step k+1, then
take step k) queues step k+1 on every rank before rank 0 waits for step k (async scheduling).
"""

from __future__ import annotations

import logging
import os
import traceback

from attnserve.config.engine import EngineConfig
from attnserve.config.fields import ConfigError
from attnserve.core.step import SchedulerOutput
from attnserve.executor.base import Executor, StepReply, WorkerConfigError, WorkerDiedError
from attnserve.executor.env import free_port, worker_env
from attnserve.executor.worker import Worker
from attnserve.layers.linear import CheckpointShapeError
from attnserve.model_executor.loader import ModelSource
from attnserve.model_executor.model_runner import ModelRunnerOutput
from attnserve.platforms import detect_platform
from attnserve.refusals.devices import RAY_INSTALL, no_ray  # noqa: F401 (RAY_INSTALL re-exported)

logger = logging.getLogger(__name__)


class _Rendezvous:
    """Rank 0's host address and a free port there (runs on the node where rank 0's actor runs)."""

    def address(self) -> str:
        import ray

        host = ray.util.get_node_ip_address()
        return f"tcp://{host}:{free_port(host)}"


class _RayWorker(Worker):
    """A Worker as a Ray actor. A ConfigError while it is built (a setting this rank refused: its KV-cache budget,
    its device's attention backend) is raised by its first call, :meth:`info`: Ray hands the caller a method's
    exception, key and all, but only the text of an actor constructor's."""

    def __init__(self, **kwargs) -> None:
        self._refused: ConfigError | None = None
        try:
            super().__init__(**kwargs)
        except ConfigError as e:
            self._refused = e

    def info(self):
        if self._refused is not None:
            raise self._refused
        return super().info()


class RayExecutor(Executor):
    def __init__(self, config: EngineConfig, hf_config, source: ModelSource) -> None:
        try:
            import ray
        except ImportError:
            raise ImportError(no_ray()) from None
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
        actor = ray.remote(_RayWorker)
        probe = ray.remote(_Rendezvous).options(num_cpus=0, runtime_env=runtime_env).remote()
        self.failed: str | None = None
        self.workers = []
        self._seq = 0  # steps queued (numbered 1, 2, ...)
        self._unchecked: dict = {}  # each rank's queue_step() calls not seen to succeed yet -> rank
        init_method = self._get([probe.address.remote()])[0]
        ray.kill(probe)
        for rank in range(n):
            self.workers.append(
                actor.options(runtime_env=runtime_env, **resources).remote(
                    config=config,
                    hf_config=hf_config,
                    source=source,
                    rank=rank,
                    world_size=n,
                    local_rank=0,
                    init_method=init_method,
                    env=worker_env(),
                )
            )
        self.info = self._get([w.info.remote() for w in self.workers])[0]
        self.pids = self._get([w.pid.remote() for w in self.workers])
        logger.info("Tensor parallel: %d Ray actors (pids %s), %s", n, self.pids, self.info.backend_name)

    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_async(sched).result()

    def execute_async(self, sched: SchedulerOutput) -> StepReply:
        """Queue the step on every rank; returns without waiting for it."""
        if self.failed:
            raise WorkerDiedError(self.failed)
        self._seq += 1
        ref = self.ray.put(sched)  # serialized once for all ranks
        for rank, w in enumerate(self.workers):
            self._unchecked[w.queue_step.remote(ref, self._seq)] = rank
        return StepReply(self._take, self._seq)

    def _take(self, seq: int) -> ModelRunnerOutput:
        """Rank 0's tokens of step ``seq``, watching every rank's queued steps for a failure meanwhile."""
        if self.failed:
            raise WorkerDiedError(self.failed)
        return self._get([self.workers[0].take_step.remote(seq)], watch=self._unchecked)[0]

    def _get(self, refs: list, watch: dict | None = None) -> list:
        """Results in order; the first failure (any rank, or any ref of ``watch``: ref -> rank) raises at once
        instead of waiting on the others. Watched refs seen to succeed leave ``watch``."""
        ray = self.ray
        index = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        waiting = set(refs)
        pending = list(refs) + list(watch or ())
        while waiting:
            ready, pending = ray.wait(pending, num_returns=1)
            if pending:  # and whatever else is done by now: watched refs leave ``watch`` as they succeed
                more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                ready += more
            for ref in ready:
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayError as e:
                    self._failed(index[ref] if ref in index else watch[ref], e)
                if ref in index:
                    results[index[ref]] = value
                    waiting.discard(ref)
                else:
                    del watch[ref]
        return results

    def _failed(self, rank: int, e: Exception):
        """Stop every actor and raise WorkerDiedError naming the rank, or WorkerConfigError (the message and key
        of a ConfigError the rank raised: a setting it refused)."""
        ray = self.ray
        pid = self.pids[rank] if getattr(self, "pids", None) else "?"
        kind = "died" if isinstance(e, ray.exceptions.RayActorError) else "failed"
        head = f"worker rank {rank} (pid {pid}, Ray actor) {kind}; pending requests failed:"
        self.failed = f"{head} {e}"
        self.shutdown()
        cause = getattr(e, "cause", None)  # a RayTaskError's: the exception the actor's method raised
        summary = f"{head} {' '.join(''.join(traceback.format_exception_only(cause or e)).split())}"
        if isinstance(cause, ConfigError) and cause.key is not None:
            logger.debug("%s", self.failed)
            raise WorkerConfigError(cause.refusal) from None
        raise WorkerDiedError(self.failed, isinstance(cause, CheckpointShapeError), summary) from None

    def shutdown(self) -> None:
        self._unchecked = {}
        if self.ray.is_initialized():  # after ray.shutdown() the actors are gone with their instance
            for w in getattr(self, "workers", []):
                self.ray.kill(w)
        self.workers = []
