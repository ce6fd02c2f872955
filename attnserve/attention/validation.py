"""The capability checks every backend shares: declared facts vs. a selector config and platform."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from attnserve.attention.backend import AttentionBackend
    from attnserve.attention.selector import AttentionSelectorConfig
    from attnserve.platforms.interface import Platform


def capability_reasons(cls: "type[AttentionBackend]", cfg: "AttentionSelectorConfig", platform: "Platform") -> list[str]:
    """Every reason ``cls`` cannot run ``cfg`` on ``platform``, each with the values involved."""
    reasons: list[str] = []
    if platform.device_type not in cls.device_types:
        reasons.append(f"device {platform.device_type} not supported (supported: {', '.join(cls.device_types)})")
    if cls.required_package and importlib.util.find_spec(cls.required_package) is None:
        extra = f"pip install 'attnserve[{cls.pip_extra}]'" if cls.pip_extra else f"pip install {cls.required_package}"
        reasons.append(f"not installed: {extra}")
    if cfg.dtype not in cls.supported_dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in cls.supported_dtypes)
        reasons.append(f"dtype {str(cfg.dtype).removeprefix('torch.')} not supported (supported: {names})")
    if cfg.kv_cache_dtype not in cls.supported_kv_cache_dtypes:
        reasons.append(f"kv_cache_dtype {cfg.kv_cache_dtype} not supported (supported: {', '.join(cls.supported_kv_cache_dtypes)})")
    if cls.supported_head_sizes is not None and cfg.head_size not in cls.supported_head_sizes:
        reasons.append(f"head_size {cfg.head_size} not supported (supported: {', '.join(map(str, cls.supported_head_sizes))})")
    if cls.supported_block_sizes is not None and cfg.block_size not in cls.supported_block_sizes:
        reasons.append(f"block_size {cfg.block_size} not supported (supported: {', '.join(map(str, cls.supported_block_sizes))})")
    if cls.block_size_multiple_of and cfg.block_size % cls.block_size_multiple_of:
        reasons.append(f"block_size {cfg.block_size} not supported (multiples of {cls.block_size_multiple_of})")
    if cfg.sliding_window is not None and not cls.supports_sliding_window:
        reasons.append(f"sliding_window {cfg.sliding_window} not supported")
    if cfg.logits_soft_cap is not None and not cls.supports_logits_soft_cap:
        reasons.append(f"logits_soft_cap {cfg.logits_soft_cap} not supported")
    if cfg.has_sink and not cls.supports_sinks:
        reasons.append("attention sinks not supported")
    if cfg.attn_type not in cls.supported_attn_types:
        reasons.append(f"attention type {cfg.attn_type.value} not supported")
    cc = platform.compute_capability
    if platform.device_type == "cuda" and cc is not None:
        lo, hi = cls.min_compute_capability, cls.max_compute_capability
        if lo is not None and cc < lo:
            reasons.append(f"compute capability {cc[0]}.{cc[1]} not supported (needs >= {lo[0]}.{lo[1]})")
        if hi is not None and cc > hi:
            reasons.append(f"compute capability {cc[0]}.{cc[1]} not supported (needs <= {hi[0]}.{hi[1]})")
    return reasons
