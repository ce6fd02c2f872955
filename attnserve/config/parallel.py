"""ParallelConfig: how the model is split over devices and which processes run the shards."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnserve.config.fields import refuses_unknown_keywords, validate_fields

DISTRIBUTED_EXECUTOR_BACKENDS = ("mp", "ray")


@refuses_unknown_keywords()
@dataclass(frozen=True)
class ParallelConfig:
    """Parallelism settings. Validated at construction."""

    tensor_parallel_size: int = field(default=1, metadata={"ge": 1, "short": "-tp"})
    """Number of devices (one worker process each) the model's layers are split across, Megatron-style:
    attention heads and MLP columns per rank, an all-reduce after each block's output projection."""

    distributed_executor_backend: str = field(default="mp", metadata={"choices": DISTRIBUTED_EXECUTOR_BACKENDS})
    """How tensor-parallel workers are started: mp (spawned processes on this host) or ray (Ray actors;
    a ``ray start`` cluster spans hosts). Unused when tensor_parallel_size is 1 (given there: warned once)."""

    disable_custom_all_reduce: bool = False
    """Disable the custom all-reduce kernel and fall back to NCCL. The custom one (CUDA, tensor_parallel_size
    2 to 8) sums small bfloat16 / float32 tensors, such as decode steps' activations, with a one-shot kernel
    over PyTorch symmetric memory (P2P over NVLink); larger tensors always use NCCL, and so does the ray
    executor (its actors may span hosts)."""

    def __post_init__(self) -> None:
        validate_fields(self)
