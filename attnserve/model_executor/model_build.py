"""The model's layers built with one attention Impl per layer, from the attention selection's groups.

The models describe their heads (``AttentionLayerSpec``); the engine adds the KV cache's element type, checks each
layer against its group's kind (``attention_selection.py``) and gives it its group's backend Impl with that
group's attention config. The first layer of each group gives the spec its metadata builder plans.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from attnserve.attention.backend import AttentionImpl, AttentionLayerSpec
from attnserve.attention.layer import Attention
from attnserve.distributed.group import TPGroup


@dataclass
class BuiltModel:
    """The model (weights not loaded) and its attention layers' records."""

    model: torch.nn.Module
    layer_specs: list[AttentionLayerSpec] = field(default_factory=list)  # every layer's, in build order
    group_specs: dict[int, AttentionLayerSpec] = field(default_factory=dict)  # group index -> its builder's spec
    attn_impls: dict[int, AttentionImpl] = field(default_factory=dict)  # layer index -> its Impl (fp8 scales)


@contextmanager
def _default(device: torch.device, dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def build_model(
    model_cls, hf_config, attention, group_configs: list, kv_cache_dtype: str, device, dtype, tp: TPGroup
) -> BuiltModel:
    """``model_cls`` built on ``device`` in ``dtype`` (tensor-parallel shard ``tp``), its attention layers from
    ``attention`` (the selection's groups) with ``group_configs[group index]``. Raises AssertionError where a
    layer's head size, window or soft cap differs from its group's kind (the model's dims disagree with itself)."""
    built = BuiltModel(None)
    groups = attention.groups

    def make_attention(spec: AttentionLayerSpec, layer_index: int) -> Attention:
        spec = dataclasses.replace(spec, kv_cache_dtype=kv_cache_dtype)  # the engine's: every plan reads it
        built.layer_specs.append(spec)
        group = attention.group_of(layer_index)
        kind = group.kind
        assert (spec.head_size, spec.sliding_window, spec.logits_soft_cap) == (
            kind.head_size,
            kind.sliding_window,
            kind.logits_soft_cap,
        ), f"layer {layer_index}'s attention {spec} differs from its model's dims ({kind})"
        built.group_specs.setdefault(group.index, spec)
        impl = group.selection.backend_cls.get_impl_cls()(spec, attention_config=group_configs[group.index])
        built.attn_impls[layer_index] = impl
        return Attention(impl, layer_index, group.index if len(groups) > 1 else None)

    with _default(device, dtype):
        built.model = model_cls(hf_config, make_attention, **({"tp": tp} if tp.size > 1 else {}))
    return built
