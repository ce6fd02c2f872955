"""SchedulerConfig: the token budget of one step."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.config.attention import ConfigError


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits. Validated at construction."""

    max_num_batched_tokens: int = 2048
    """Most tokens (prefill + decode) computed in one step."""

    max_num_seqs: int = 256
    """Most requests running at once."""

    enable_chunked_prefill: bool = True
    """Split a prompt longer than the step's remaining token budget over several steps."""

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} {v!r} not allowed (allowed: integer >= 1)")
