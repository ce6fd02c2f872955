"""SchedulerConfig: the token budget of one step."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnserve.config.fields import validate_fields


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits. Validated at construction."""

    max_num_batched_tokens: int = field(default=2048, metadata={"ge": 1, "human_readable": True})
    """Most tokens (prefill + decode) computed in one step (e.g. 2048 or 2K)."""

    max_num_seqs: int = field(default=256, metadata={"ge": 1})
    """Most requests running at once."""

    enable_chunked_prefill: bool = True
    """Split a prompt longer than the step's remaining token budget over several steps."""

    async_scheduling: bool | None = None
    """Schedule and prepare step k+1 on the host while the device runs step k (vLLM's --async-scheduling);
    a decode's newest token is fed on the device (under tensor parallelism rank 0 broadcasts it to the other
    ranks). Default (null): on for a GPU, any tensor_parallel_size; off on CPU (no overlap to gain)."""

    def __post_init__(self) -> None:
        validate_fields(self)
