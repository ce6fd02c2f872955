"""ParallelConfig: how the model is split over devices."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.config.attention import ConfigError


@dataclass(frozen=True)
class ParallelConfig:
    """Parallelism settings. Validated at construction."""

    tensor_parallel_size: int = 1
    """Number of devices the model's layers are split across (only 1 so far)."""

    def __post_init__(self) -> None:
        if self.tensor_parallel_size != 1:
            raise ConfigError(
                f"tensor_parallel_size {self.tensor_parallel_size!r} not allowed (allowed: 1; tensor parallelism is not built yet)"
            )
