"""SchedulerConfig: the token budget of one step, and its default for the device and entry point."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from attnserve.config.fields import refuses_unknown_keywords, validate_fields
from attnserve.refusals import Refusal, Refused


@refuses_unknown_keywords()
@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits. Validated at construction."""

    max_num_batched_tokens: int | None = field(default=None, metadata={"ge": 1, "human_readable": True})
    """Most tokens (prefill + decode) computed in one step (e.g. 8192 or 8K). Default (null): vLLM's choice for
    the device and entry point (:func:`default_max_num_batched_tokens`): on a GPU of at least 70 GiB 16384 for
    ``LLM`` and the offline benchmarks, 8192 for the server; on a smaller GPU 8192 and 2048; 2048 on CPU."""

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


# vLLM's defaults (EngineArgs._set_default_args): larger steps on large GPUs; the server keeps steps shorter so that
# a long prompt delays the decodes that share its step less
_LARGE_GPU_BYTES = 70 * (1 << 30)
_GPU_BUDGETS = {True: {"llm": 16384, "server": 8192}, False: {"llm": 8192, "server": 2048}}
CPU_MAX_NUM_BATCHED_TOKENS = 2048

EngineUsage = Literal["llm", "server"]
"""Which entry point runs the engine (vLLM's ``UsageContext``): ``"llm"`` (LLM, generate, offline benchmarks) or
``"server"``; it picks the step token budget's default."""


def check_usage(usage: object) -> EngineUsage:
    """``usage`` if it is an :data:`EngineUsage`; raises Refused (path ``("usage",)``) for any other value."""
    allowed = get_args(EngineUsage)
    if usage not in allowed:
        raise Refused(Refusal(("usage",), usage, ", ".join(map(repr, allowed))))
    return usage  # type: ignore[return-value]


def default_max_num_batched_tokens(device_type: str, total_memory: int | None, usage: EngineUsage) -> int:
    """The step token budget when ``max_num_batched_tokens`` is unset, for ``usage`` (checked on every device:
    :func:`check_usage`). ``total_memory``: the GPU's bytes (None: a small GPU)."""
    check_usage(usage)
    if device_type != "cuda":
        return CPU_MAX_NUM_BATCHED_TOKENS
    return _GPU_BUDGETS[(total_memory or 0) >= _LARGE_GPU_BYTES][usage]
