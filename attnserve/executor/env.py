"""The environment tensor-parallel workers start with, and a free port for the process group's rendezvous."""

from __future__ import annotations

import os
import socket

# NVLink multicast (NVLS / symmetric-memory multicast) stays off: it is not usable on the H200 machines this
# project runs on. A value the user set in the environment wins.
WORKER_ENV_DEFAULTS = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def worker_env() -> dict[str, str]:
    """Variables to set in every worker: the defaults above unless already set here."""
    return {k: os.environ.get(k, v) for k, v in WORKER_ENV_DEFAULTS.items()}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (the OS picks; a tiny race with other programs remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
