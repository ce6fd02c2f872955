"""CUDA: device detection and the backend priority list by compute capability."""

from __future__ import annotations

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.platforms.interface import Platform
from attnserve.refusals import Refused
from attnserve.refusals import devices as words


def cuda_backend_priorities(compute_capability: tuple[int, int] | None) -> list[AttentionBackendEnum]:
    """The priority list by compute capability.

    Hopper (CC 9.x) puts TRITON_ATTN first: it beats FlashAttention-3 on decode-bound workloads (H200, H100)
    and, since its cascade's split counts, on the shared-prefix (cascade) one (H100); docs/benchmarks.md,
    "Beside vLLM 0.26.0". Blackwell
    (CC 10.x) prefers FlashInfer, as vLLM does (vLLM's reason: its TRT-LLM kernels, which attnserve does not
    wire: FlashInfer's own kernels run); every other GPU FlashAttention first.
    """
    A = AttentionBackendEnum
    if compute_capability is not None and compute_capability[0] == 9:
        first = [A.TRITON_ATTN, A.FLASH_ATTN, A.FLASHINFER]
    elif compute_capability is not None and compute_capability[0] == 10:
        first = [A.FLASHINFER, A.FLASH_ATTN, A.TRITON_ATTN]
    else:
        first = [A.FLASH_ATTN, A.FLASHINFER, A.TRITON_ATTN]
    return first + [A.FLEX_ATTENTION]


def detect_cuda_platform(index: int = 0) -> Platform:
    """The real GPU ``index``: name, compute capability and memory. Raises ValueError without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise Refused(words.no_cuda(index))
    if index >= torch.cuda.device_count():
        raise Refused(words.no_such_gpu(index, torch.cuda.device_count()))
    props = torch.cuda.get_device_properties(index)
    return Platform(
        device_type="cuda",
        device_name=props.name,
        compute_capability=(props.major, props.minor),
        total_memory=props.total_memory,
    )


def simulated_cuda_platform(compute_capability: tuple[int, int]) -> Platform:
    """A named GPU generation for planning and tests (``cuda:9.0``); nothing is detected."""
    return Platform(device_type="cuda", device_name="simulated", compute_capability=compute_capability, simulated=True)
