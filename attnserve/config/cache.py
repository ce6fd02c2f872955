"""CacheConfig: the paged KV cache's block size, dtype and size."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.config.attention import ConfigError

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV-cache settings. Validated at construction."""

    block_size: int = 16
    """Tokens per KV-cache block."""

    kv_cache_dtype: str = "auto"
    """KV-cache element type: auto (= model dtype), fp8 or fp8_e4m3."""

    num_gpu_blocks: int | None = None
    """Number of KV-cache blocks; overrides the memory budget when set."""

    kv_cache_memory: int | None = None
    """KV-cache budget in bytes (all layers, K and V). None = 2 GiB on CPU, gpu_memory_utilization on GPU."""

    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory the engine may use (weights, activations and KV cache)."""

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(f"block_size {self.block_size!r} not allowed (allowed: integer >= 1)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} not allowed (allowed: {', '.join(KV_CACHE_DTYPES)})"
            )
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ConfigError(f"num_gpu_blocks {self.num_gpu_blocks!r} not allowed (allowed: integer >= 1)")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ConfigError(f"kv_cache_memory {self.kv_cache_memory!r} not allowed (allowed: bytes >= 1)")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization {self.gpu_memory_utilization!r} not allowed (allowed: 0 < x <= 1)"
            )
