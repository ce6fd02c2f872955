"""Platform: the facts about a device that attention selection needs, and its backend priority list."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.attention.registry import AttentionBackendEnum


@dataclass(frozen=True)
class Platform:
    """A device kind with its capability. ``device_type`` is "cuda" or "cpu".

    ``simulated`` marks a platform named for planning (``cuda:9.0``): no device is touched.
    """

    device_type: str
    device_name: str
    compute_capability: tuple[int, int] | None = None  # CUDA only, (major, minor)
    total_memory: int | None = None  # bytes
    simulated: bool = False

    @property
    def description(self) -> str:
        """E.g. ``"NVIDIA H200 (compute capability 9.0)"``, ``"simulated CUDA device (compute capability 9.0)"``."""
        if self.compute_capability is None:
            return self.device_name
        major, minor = self.compute_capability
        name = "simulated CUDA device" if self.device_name == "simulated" else self.device_name
        return f"{name} (compute capability {major}.{minor})"

    def backend_priorities(self) -> list[AttentionBackendEnum]:
        """Backends in the order automatic selection tries them (vLLM's priority lists)."""
        if self.device_type == "cpu":
            from attnserve.platforms.cpu import cpu_backend_priorities

            return cpu_backend_priorities()
        from attnserve.platforms.cuda import cuda_backend_priorities

        return cuda_backend_priorities(self.compute_capability)

    def to_dict(self) -> dict:
        """JSON-ready facts (used by ``attnserve backends --json``)."""
        cc = self.compute_capability
        return {
            "device_type": self.device_type,
            "device_name": self.device_name,
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
            "total_memory": self.total_memory,
            "simulated": self.simulated,
            "description": self.description,
        }
