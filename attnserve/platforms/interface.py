"""Platform: the facts about a device that attention selection needs, and its backend priority list."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.attention.registry import AttentionBackendEnum


@dataclass(frozen=True)
class Platform:
    """A device kind with its capability. ``device_type`` is "cuda" or "cpu"."""

    device_type: str
    device_name: str
    compute_capability: tuple[int, int] | None = None  # CUDA only, (major, minor)
    total_memory: int | None = None  # bytes

    @property
    def description(self) -> str:
        if self.compute_capability is None:
            return self.device_name
        major, minor = self.compute_capability
        return f"{self.device_name} (compute capability {major}.{minor})"

    def backend_priorities(self) -> list[AttentionBackendEnum]:
        """Backends in the order automatic selection tries them (vLLM's priority lists)."""
        if self.device_type == "cpu":
            return [AttentionBackendEnum.CPU_ATTN, AttentionBackendEnum.FLEX_ATTENTION]
        if self.compute_capability is not None and self.compute_capability[0] == 10:
            return [
                AttentionBackendEnum.FLASHINFER,
                AttentionBackendEnum.FLASH_ATTN,
                AttentionBackendEnum.TRITON_ATTN,
                AttentionBackendEnum.FLEX_ATTENTION,
            ]
        return [
            AttentionBackendEnum.FLASH_ATTN,
            AttentionBackendEnum.FLASHINFER,
            AttentionBackendEnum.TRITON_ATTN,
            AttentionBackendEnum.FLEX_ATTENTION,
        ]
