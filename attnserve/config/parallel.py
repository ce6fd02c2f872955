"""ParallelConfig: how the model is split over devices."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnserve.config.fields import validate_fields


@dataclass(frozen=True)
class ParallelConfig:
    """Parallelism settings. Validated at construction."""

    tensor_parallel_size: int = field(default=1, metadata={"choices": (1,)})
    """Number of devices the model's layers are split across (only 1: tensor parallelism is not built yet)."""

    def __post_init__(self) -> None:
        validate_fields(self)
