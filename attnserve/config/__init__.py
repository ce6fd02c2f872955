"""Typed, validated configuration records."""

from attnserve.config.attention import AttentionConfig, ConfigError
from attnserve.config.cache import CacheConfig
from attnserve.config.engine import EngineConfig
from attnserve.config.model import ModelConfig
from attnserve.config.parallel import ParallelConfig
from attnserve.config.scheduler import SchedulerConfig

__all__ = [
    "AttentionConfig",
    "CacheConfig",
    "ConfigError",
    "EngineConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
]
