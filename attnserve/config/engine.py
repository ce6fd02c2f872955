"""EngineConfig: the engine's one configuration object, passed explicitly through the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnserve.config.attention import AttentionConfig, ConfigError
from attnserve.config.cache import CacheConfig
from attnserve.config.model import ModelConfig
from attnserve.config.parallel import ParallelConfig
from attnserve.config.scheduler import SchedulerConfig

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class EngineConfig:
    """Model, cache, scheduler, parallel and attention settings, plus the device and CUDA-graph switch."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    device: str = "auto"
    """auto (cuda when available, else cpu), cpu or cuda."""
    enforce_eager: bool = False
    """Never capture CUDA graphs."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES and not str(self.device).startswith("cuda:"):
            raise ConfigError(f"device {self.device!r} not allowed (allowed: {', '.join(DEVICES)}, cuda:N)")
