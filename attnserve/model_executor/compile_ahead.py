"""The attention kernels a model will need, compiled ahead by backends that JIT-compile them (FLASHINFER).

    compile_attention_kernels_ahead(config, attention, num_heads, num_kv_heads, device)

From the layer groups alone (no weights): the engine calls it right after its backend selection, before the
tokenizer and the weights (one rank: ``executor/loading.py``), and each ModelRunner before it builds its layers
(its own rank's heads; in the engine's process the same modules, so the first call's build serves). Each
backend's ``compile_ahead`` runs its build in the background and never raises.
"""

from __future__ import annotations

import logging

import torch

from attnserve.attention.backend import AttentionLayerSpec
from attnserve.config.engine import EngineConfig
from attnserve.model_executor.attention_selection import ModelAttention
from attnserve.models.dims import LayerAttention

logger = logging.getLogger(__name__)


def group_layer_specs(
    config: EngineConfig, attention: ModelAttention, num_heads: int, num_kv_heads: int
) -> dict[type, list[AttentionLayerSpec]]:
    """Backend class -> one layer spec per layer group it serves, as the runner will build them (the engine's
    kv_cache_dtype; the scale does not change a kernel)."""
    out: dict[type, list[AttentionLayerSpec]] = {}
    for g in attention.groups:
        spec = layer_spec_of(g.kind, num_heads, num_kv_heads, config.cache.kv_cache_dtype)
        out.setdefault(g.selection.backend_cls, []).append(spec)
    return out


def layer_spec_of(kind: LayerAttention, num_heads: int, num_kv_heads: int, kv_cache_dtype: str) -> AttentionLayerSpec:
    """The layer spec a kernel warm-up or report needs for a layer group (scale head_size ** -0.5: a scale does not
    change which kernel runs)."""
    return AttentionLayerSpec(
        num_heads=num_heads,
        head_size=kind.head_size,
        scale=kind.head_size**-0.5,
        num_kv_heads=num_kv_heads,
        sliding_window=kind.sliding_window,
        logits_soft_cap=kind.logits_soft_cap,
        kv_cache_dtype=kv_cache_dtype,
    )


def compile_attention_kernels_ahead(
    config: EngineConfig, attention: ModelAttention, num_heads: int, num_kv_heads: int, device: torch.device
) -> None:
    """Each selected backend's ``compile_ahead`` for its layer groups (nothing for backends without JIT kernels)."""
    dtype = attention.groups[0].selector_config.dtype
    for backend_cls, specs in group_layer_specs(config, attention, num_heads, num_kv_heads).items():
        try:
            backend_cls.compile_ahead(specs, device, dtype, config.attention)
        except Exception as e:  # noqa: BLE001 - a warm-up never fails an engine start
            logger.warning("%s: kernels not compiled ahead (%s: %s)", backend_cls.name, type(e).__name__, e)
