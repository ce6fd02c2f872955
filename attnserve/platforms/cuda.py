"""CUDA: device detection and the backend priority list by compute capability."""

from __future__ import annotations

from attnserve.attention.registry import AttentionBackendEnum
from attnserve.platforms.interface import Platform
from attnserve.refusals import Refused
from attnserve.refusals import devices as words


def cuda_backend_priorities(compute_capability: tuple[int, int] | None) -> list[AttentionBackendEnum]:
    """vLLM's lists: Blackwell (CC 10.x) prefers FlashInfer (vLLM's reason: its TRT-LLM kernels, which attnserve does
    not wire: FlashInfer's own kernels run); every other GPU FlashAttention."""
    if compute_capability is not None and compute_capability[0] == 10:
        first = [AttentionBackendEnum.FLASHINFER, AttentionBackendEnum.FLASH_ATTN]
    else:
        first = [AttentionBackendEnum.FLASH_ATTN, AttentionBackendEnum.FLASHINFER]
    return first + [AttentionBackendEnum.TRITON_ATTN, AttentionBackendEnum.FLEX_ATTENTION]


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
