"""SymmMemAllReduce: a one-shot all-reduce through PyTorch symmetric memory for small CUDA tensors.

At batch-1 decode a tensor-parallel step all-reduces one ``(tokens, hidden)`` activation per row-parallel
layer (Llama-3.1-8B: 64 of 8 KiB per step), where NCCL's per-call latency dominates. Here every rank owns one
buffer of the same size, mapped into every other rank's address space (``torch.distributed._symmetric_memory``:
``empty`` + ``rendezvous``, the CUDA backend: P2P over NVLink, no multicast). One kernel per call
(``torch.ops.symm_mem.one_shot_all_reduce_copy_out``, torch >= 2.9; checked against 2.11 and 2.13) copies
this rank's input into its buffer, meets the peers at a per-block signal-pad barrier, loads every rank's
buffer and writes the sum into the input, in place; a second barrier keeps a peer's next call from
overwriting a buffer still being read. The algorithm is vLLM's custom all-reduce "1-stage" kernel, which
vLLM uses for every size on 2 GPUs (``csrc/custom_all_reduce.cuh``); the size limits below follow it.

Every rank adds the buffers in rank order (``load_and_reduce``: rank 0's + rank 1's + ...), so all ranks get
bitwise-identical sums; with 2 ranks they equal NCCL's (a + b == b + a in IEEE arithmetic). bfloat16 sums
in bfloat16 (``__hadd2``), float32 in float32. Kernels only, no host synchronization: capturable in CUDA
graphs (the buffer is allocated and rendezvoused before any capture).

Whether a call takes this path (:meth:`SymmMemAllReduce.should_use`) depends only on the tensor's device,
dtype, element count and contiguity, which all tensor-parallel ranks share at a collective: the ranks never
disagree, which would leave one rank in NCCL and the other at the signal pad.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from attnserve.distributed.group import TPGroup

logger = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB

SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)
"""The dtypes torch's one-shot kernel is built for (``AT_DISPATCH_FLOAT_AND_BFLOAT16``); float16 goes to NCCL."""

MAX_BYTES = {2: 2 * MiB, 3: 512 * KiB, 4: 512 * KiB, 5: 256 * KiB, 6: 256 * KiB, 7: 256 * KiB, 8: 256 * KiB}
"""World size -> the largest tensor (bytes) taken. vLLM's custom all-reduce runs its one-shot kernel below
512 KiB on up to 4 GPUs and 256 KiB on up to 8, at any size on 2 (up to its 8 MiB buffer); torch's one-shot
kernel uses at most 24 blocks, so 2 GPUs stop at 2 MiB (a 256-token decode step of hidden 4096, bfloat16)
and larger tensors (prefill) go to NCCL. ``benchmarks/gpu/bench_allreduce.py`` times both paths per size."""

ALIGN = 16  # bytes: the kernel's widest vector access


def within_limits(x: torch.Tensor, max_bytes: int) -> bool:
    """The device-independent rules: a supported dtype, contiguous, 1 to ``max_bytes`` bytes, a whole number
    of 4-byte words (the kernel's smallest vector). Shape-level facts only, the same on every rank."""
    nbytes = x.numel() * x.element_size()
    return x.dtype in SUPPORTED_DTYPES and x.is_contiguous() and 0 < nbytes <= max_bytes and nbytes % 4 == 0


def unavailable_reason(device: torch.device, world_size: int) -> str | None:
    """Why this process cannot run the symmetric-memory all-reduce on ``device``, or None when it can try
    (the allocation and rendezvous can still fail: :meth:`SymmMemAllReduce.create` handles that)."""
    if device.type != "cuda":
        return f"device {device} is not a CUDA device"
    if world_size not in MAX_BYTES:
        return f"world size {world_size} is not one of {min(MAX_BYTES)}..{max(MAX_BYTES)}"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    try:  # registers the symm_mem ops' Python parts (``from``: a plain ``import torch.x`` would bind a local torch)
        from torch.distributed import _symmetric_memory  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} has no symmetric memory ({e})"
    ops = torch.ops.symm_mem
    missing = [name for name in ("one_shot_all_reduce", "one_shot_all_reduce_out") if not hasattr(ops, name)]
    if missing:
        return f"torch {torch.__version__} lacks torch.ops.symm_mem.{', '.join(missing)}"
    return None


class SymmMemAllReduce:
    """One rank's symmetric buffer and the one-shot sum over the default process group.

    Build with :meth:`create` (collective: every rank of the group calls it at the same point). ``buffer`` is
    ``max_bytes`` of uint8 on ``device``; ``fused`` is whether the copy into the buffer runs inside the
    all-reduce kernel (``one_shot_all_reduce_copy_out``) rather than as a separate copy.
    """

    def __init__(self, buffer: torch.Tensor, group_name: str, world_size: int, max_bytes: int, fused: bool) -> None:
        self.buffer = buffer
        self.group_name = group_name
        self.world_size = world_size
        self.max_bytes = max_bytes
        self.fused = fused

    def __repr__(self) -> str:
        return (
            f"SymmMemAllReduce(world_size={self.world_size}, max_bytes={self.max_bytes}, "
            f"fused={self.fused}, device={self.buffer.device})"
        )

    @classmethod
    def create(
        cls, tp: TPGroup, device: torch.device, max_bytes: int | None = None, fused: bool | None = None
    ) -> SymmMemAllReduce | None:
        """Allocate and rendezvous the buffer on every rank of ``tp`` (a TPGroup over the initialized default
        NCCL process group), or return None on every rank, after one warning line saying why, when any rank
        cannot. The ranks agree after each step (an NCCL all-reduce), so that no rank waits in a rendezvous
        that a peer skipped and no rank ends up on a different all-reduce path. Never raises for a setup
        failure: this is an optimization, NCCL still works.

        ``max_bytes``: the largest tensor taken (default ``MAX_BYTES[world size]``, rounded up to 16 bytes).
        ``fused``: force the fused copy on/off (tests); default: fused when torch has the op.
        """
        import torch.distributed as dist

        limit = -(-(max_bytes if max_bytes is not None else MAX_BYTES.get(tp.size, 0)) // ALIGN) * ALIGN
        try:
            reason = unavailable_reason(device, tp.size)
        except Exception as e:  # noqa: BLE001  (a probe that breaks is a reason too: NCCL on every rank)
            reason = f"probing symmetric memory failed: {type(e).__name__}: {e}"
        buffer = None
        if reason is None:
            from torch.distributed import _symmetric_memory as symm_mem

            if fused is None:
                fused = hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out")
            try:
                buffer = symm_mem.empty(limit, dtype=torch.uint8, device=device)
            except Exception as e:  # noqa: BLE001  (any failure: fall back to NCCL)
                reason = f"symmetric-memory allocation of {limit} bytes failed: {type(e).__name__}: {e}"
        if not _all_ranks_ok(tp, device, reason):
            return None
        group_name = dist.group.WORLD.group_name
        try:
            symm_mem.rendezvous(buffer, group_name)
        except Exception as e:  # noqa: BLE001
            reason = f"symmetric-memory rendezvous failed: {type(e).__name__}: {e}"
        if not _all_ranks_ok(tp, device, reason):
            return None
        backend = symm_mem.get_backend(device) if hasattr(symm_mem, "get_backend") else "?"
        logger.info(
            "custom all-reduce: symmetric-memory one-shot (%s backend, %s copy) for tensors up to %d bytes, NCCL above",
            backend,
            "fused" if fused else "separate",
            limit,
        )
        return cls(buffer, group_name, tp.size, limit, bool(fused))

    def should_use(self, x: torch.Tensor) -> bool:
        """True when ``x`` goes through :meth:`all_reduce`: CUDA, bfloat16 or float32, contiguous, at most
        ``max_bytes`` (and a multiple of 4 bytes). The same answer on every rank for the same shape."""
        return x.is_cuda and within_limits(x, self.max_bytes)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` (any shape, :meth:`should_use` true) over the ranks, in place; returns ``x``.

        Queued on the current stream like any kernel. The fused kernel reads ``x`` through 16-byte vectors and
        needs ``x``'s address and storage offset 16-byte aligned (PyTorch's allocator aligns blocks to 512
        bytes); any other ``x`` is copied into the buffer first and the sum copied back. Both paths run the
        same kernel and barriers on the buffer, so ranks may differ in which one they take.
        """
        numel = x.numel()
        buf = self.buffer[: numel * x.element_size()].view(x.dtype)  # offset 0: 16-byte aligned
        ops = torch.ops.symm_mem
        offset = x.storage_offset() * x.element_size()
        if self.fused and x.data_ptr() % ALIGN == 0 and offset % ALIGN == 0:
            ops.one_shot_all_reduce_copy_out(buf, x.view(-1), "sum", self.group_name, x.view(-1))
            return x
        buf.copy_(x.view(-1))
        if x.data_ptr() % ALIGN == 0 and offset % ALIGN == 0:
            ops.one_shot_all_reduce_out(buf, "sum", self.group_name, x.view(-1))
        else:  # the kernel stores 16-byte vectors to its output: sum into a fresh (aligned) tensor
            x.view(-1).copy_(ops.one_shot_all_reduce(buf, "sum", self.group_name))
        return x


def _all_ranks_ok(tp: TPGroup, device: torch.device, reason: str | None) -> bool:
    """Whether every rank got this far without a ``reason`` to stop; logs one warning line when not."""
    if not tp.min_int(0 if reason else 1, device):
        logger.warning(
            "custom all-reduce off, all-reduce uses NCCL: %s",
            reason or "another tensor-parallel rank could not set up symmetric memory",
        )
        return False
    return True
