"""Two (or more) spawned ranks on one host's GPUs, as the engine's workers join them: the workers' environment
(NVLink multicast off), an NCCL default process group bound to GPU ``rank``, a TPGroup.

``run_ranks(fn, world_size, *args)`` spawns ``world_size`` processes (``torch.multiprocessing``, ``spawn``),
calls ``fn(tp, device, *args)`` in each, and returns rank 0's return value (it must be picklable). A rank that
raises fails the call with its traceback (the other ranks are terminated). ``fn`` must be a module-level
function of an importable module (``tests.gpu...``): run from the repository root.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.multiprocessing as mp


def _rank(rank: int, world_size: int, init_method: str, out_path: str, fn, args) -> None:
    from attnserve.executor.env import worker_env

    os.environ.update(worker_env())  # NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1: before NCCL starts
    import pickle

    import torch.distributed as dist

    from attnserve.distributed.group import TPGroup

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world_size, device_id=device)
    try:
        result = fn(TPGroup(rank, world_size), device, *args)
        if rank == 0:
            with open(out_path, "wb") as f:
                pickle.dump(result, f)
    finally:
        torch.cuda.synchronize()
        dist.destroy_process_group()


def run_ranks(fn, world_size: int, *args):
    import pickle

    with tempfile.TemporaryDirectory() as tmp:
        init_method = "file://" + os.path.join(tmp, "rendezvous")
        out_path = os.path.join(tmp, "result.pkl")
        mp.spawn(_rank, args=(world_size, init_method, out_path, fn, args), nprocs=world_size, join=True)
        with open(out_path, "rb") as f:
            return pickle.load(f)
