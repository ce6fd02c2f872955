"""CacheConfig: the paged KV cache's block size, dtype and size."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnserve.config.fields import ConfigError, refuses_unknown_keywords, validate_fields
from attnserve.refusals.config import KV_SCALES_NEED_FP8

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's CacheDType
# vLLM's BlockSize (1, 8, 16, 32, 64, 128, 256: vllm/config/cache.py) and 2 and 4, which the CPU backends run (the
# tests' tiny caches): every size a built-in backend supports is among them (FLASHINFER 16-64, TRITON_ATTN 16-256,
# FLASH_ATTN multiples of 16 — 48 or 80 only as vLLM refuses them too —, CPU_ATTN and FLEX_ATTENTION any), and the
# selector still judges each backend's own sizes
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@refuses_unknown_keywords()
@dataclass(frozen=True)
class CacheConfig:
    """Paged KV-cache settings. Validated at construction."""

    block_size: int = field(default=16, metadata={"choices": BLOCK_SIZES})
    """Tokens per KV-cache block: 1 to 256, a power of two (vLLM's sizes, and 2 and 4). Each backend states the
    sizes it supports among them (FLASHINFER 16, 32, 64; TRITON_ATTN 16 to 256; FLASH_ATTN multiples of 16),
    checked at backend selection."""

    kv_cache_dtype: str = field(default="auto", metadata={"choices": KV_CACHE_DTYPES})
    """KV-cache element type: auto (= model dtype), fp8 (= fp8_e4m3: float8_e4m3fn) or fp8_e5m2 (float8_e5m2); a
    backend that cannot read it is refused at selection. fp8 stores ``x / scale`` saturated to the format's range,
    with per-layer scales from the checkpoint (``k_scale``/``v_scale``), calculate_kv_scales, else 1.0."""

    calculate_kv_scales: bool = False
    """fp8 KV cache: compute each layer's k/v scales from the first prefill step (vLLM's rule: the absolute maximum
    over 200 for keys, over 100 for values) instead of the checkpoint's or 1.0; CUDA graphs are captured after
    that step. Refused with a 16-bit cache."""

    num_gpu_blocks: int | None = field(default=None, metadata={"ge": 1, "aliases": ("num_gpu_blocks_override",)})
    """Number of KV-cache blocks; overrides the memory budget when set (vLLM's name: num_gpu_blocks_override). A
    cache smaller than max_model_len: serve refuses to start (as vLLM), naming the largest max_model_len that fits;
    generate and the benchmarks end each request (finish_reason length) when it fills the whole cache."""

    kv_cache_memory: int | None = field(
        default=None, metadata={"ge": 1, "unit": "bytes", "human_readable": True, "aliases": ("kv_cache_memory_bytes",)}
    )
    """KV-cache budget in bytes (all layers, K and V), e.g. 8G (8 GiB); vLLM's name: kv_cache_memory_bytes. None =
    2 GiB on CPU, gpu_memory_utilization on GPU."""

    enable_prefix_caching: bool = True
    """Reuse the KV blocks of a prompt prefix an earlier request computed (automatic prefix caching: full blocks
    keyed by a sha256 chain over their tokens, free ones evicted least recently used first); vLLM's default."""

    gpu_memory_utilization: float = field(default=0.9, metadata={"gt": 0, "le": 1})
    """Fraction of GPU memory the engine may use (weights, activations and KV cache)."""

    def __post_init__(self) -> None:
        validate_fields(self)
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ConfigError(KV_SCALES_NEED_FP8)
