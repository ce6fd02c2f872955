"""The environment tensor-parallel workers start with, and a free port for the process group's rendezvous."""

from __future__ import annotations

import contextlib
import os
import socket

# NVLink multicast (NVLS / symmetric-memory multicast) stays off: it is not usable on the H200 machines this
# project runs on. A value the user set in the environment wins. Only the workers need them: every rank,
# rank 0 included, runs in a worker (spawned process or Ray actor), and the engine's own process joins no
# process group. A spawned worker has them in its environment from its start (``environ`` around the spawn),
# a Ray actor through its runtime_env, and the Worker sets them again before NCCL starts.
WORKER_ENV_DEFAULTS = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def worker_env() -> dict[str, str]:
    """Variables to set in every worker: the defaults above unless already set here."""
    return {k: os.environ.get(k, v) for k, v in WORKER_ENV_DEFAULTS.items()}


@contextlib.contextmanager
def environ(env: dict[str, str]):
    """``env`` set in this process's environment for the block, then restored: a process spawned inside
    it starts with these variables (before it imports torch or NCCL reads anything)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (the OS picks; a tiny race with other programs remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
