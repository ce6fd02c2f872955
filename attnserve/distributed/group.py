"""TPGroup: this process's place among the tensor-parallel ranks, and the collectives the layers need.

Passed explicitly (model constructors take ``tp=``), never read from a module-level global. With
``size == 1`` every collective returns its input untouched, so a single process runs no torch.distributed
code at all. With ``size > 1`` the default process group must be initialized (NCCL on GPUs, gloo on CPU);
the workers in ``attnserve/executor`` do that. On CUDA a worker may attach a :class:`SymmMemAllReduce`
(``fast_all_reduce``), which :meth:`TPGroup.all_reduce` uses for the small tensors it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from attnserve.distributed.symm_mem_all_reduce import SymmMemAllReduce


@dataclass(frozen=True)
class TPGroup:
    """Rank and world size of the tensor-parallel group (the whole default process group)."""

    rank: int = 0
    size: int = 1
    fast_all_reduce: SymmMemAllReduce | None = field(default=None, compare=False, repr=False)
    """The symmetric-memory all-reduce for small CUDA tensors (None: NCCL / gloo for every all-reduce). Not
    part of the group's identity: excluded from ``==``, ``hash`` and ``repr``."""

    def __post_init__(self) -> None:
        assert 0 <= self.rank < self.size, (self.rank, self.size)

    @property
    def is_driver(self) -> bool:
        """Rank 0 samples and returns the step's tokens; the other ranks only run the forward pass."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:  # any shape; summed over ranks, in place
        if self.size == 1:
            return x
        if self.fast_all_reduce is not None and self.fast_all_reduce.should_use(x):
            return self.fast_all_reduce.all_reduce(x)
        import torch.distributed as dist

        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:  # (..., n) -> (..., size * n), rank order
        if self.size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``x`` of rank ``src`` on every rank, in place (the others pass a buffer of the same shape and dtype).
        Queued on the device's stream like the other collectives (no host wait on a GPU)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        dist.broadcast(x, src=src)
        return x

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest ``value`` over ranks (e.g. KV blocks: every rank must hold the scheduler's count)."""
        if self.size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def all_gather_object(self, obj: object) -> list[object]:
        """``obj`` of every rank, in rank order (small picklable values: startup checks only)."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[object] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out


SINGLE = TPGroup()
