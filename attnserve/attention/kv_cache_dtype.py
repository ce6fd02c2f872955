"""The KV cache's element type and its fp8 scales: the dtype a ``kv_cache_dtype`` names, the constants
``calculate_kv_scales`` divides by, and the check every scale passes (a positive finite number)."""

from __future__ import annotations

import torch


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type: ``auto`` = ``model_dtype``; ``fp8``/``fp8_e4m3`` = float8_e4m3fn;
    ``fp8_e5m2`` = float8_e5m2."""
    if kv_cache_dtype == "auto":
        return model_dtype
    return torch.float8_e5m2 if kv_cache_dtype == "fp8_e5m2" else torch.float8_e4m3fn


# vLLM's Q/K/V_SCALE_CONSTANT (vllm/envs.py): calculate_kv_scales sets scale = amax / constant, so the first
# prefill's largest value is stored as 200 (keys, queries) or 100 (values), leaving headroom below the e4m3
# maximum of 448 for later tokens
Q_SCALE_CONSTANT, K_SCALE_CONSTANT, V_SCALE_CONSTANT = 200.0, 200.0, 100.0


def first_bad_kv_scale(k_scale: float, v_scale: float, q_scale: float | None = None) -> tuple[str, float] | None:
    """``(name, value)`` of the first fp8 scale that is not a positive finite number (``q_scale`` None: not set),
    or None when all are."""
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale), ("q_scale", q_scale)):
        if value is not None and not (0.0 < value < float("inf")):
            return name, value
    return None
