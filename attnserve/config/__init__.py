"""Typed, validated configuration records, and the engine arguments that build them."""

from attnserve.config.attention import AttentionConfig
from attnserve.config.cache import CacheConfig
from attnserve.config.engine import EngineConfig
from attnserve.config.engine_args import build_engine_config
from attnserve.config.fields import ConfigError
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
    "build_engine_config",
]
