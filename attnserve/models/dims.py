"""ModelDims: the few facts about a model that the runner needs before building it.

The runner sizes the KV cache (layers x KV heads x head size) and chooses the attention backend (head size,
sliding window) from these. Each model class answers them from its own Hugging Face config through a
``dims(config)`` classmethod, since configs name them differently (GPT-2: ``n_layer``/``n_head``/``n_inner``;
OPT: ``ffn_dim``, no ``num_key_value_heads``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    """Shape facts of one decoder-only model, read from its config."""

    num_layers: int  # attention layers, one KV cache each
    num_heads: int  # query heads per layer
    num_kv_heads: int  # KV heads per layer (== query heads without GQA)
    head_size: int
    hidden_size: int
    intermediate_size: int  # MLP width (for the activation-memory estimate)
    vocab_size: int
    sliding_window: int | None = None  # attention window in tokens; None = full context
    # per layer, where layers differ (Gemma: sliding-window layers between global ones); None: every layer is
    # LayerAttention(head_size, sliding_window)
    layers: tuple["LayerAttention", ...] | None = None
    has_sink: bool = False  # every layer adds a learned sink logit per head (gpt-oss), when ``layers`` is None

    def layer_attention(self) -> tuple["LayerAttention", ...]:
        """What each layer's attention needs from a backend, layer by layer (``num_layers`` records)."""
        if self.layers is not None:
            return self.layers
        return (LayerAttention(self.head_size, self.sliding_window, has_sink=self.has_sink),) * self.num_layers


@dataclass(frozen=True)
class LayerAttention:
    """The facts of one attention layer that decide which backends can run it; layers with equal records form
    one layer group (one backend, one metadata builder, one KV-cache layout)."""

    head_size: int
    sliding_window: int | None = None  # tokens; None = full attention
    logits_soft_cap: float | None = None  # tanh cap on the attention scores; None = none
    has_sink: bool = False  # a learned sink logit per head

    def describe(self) -> str:
        """E.g. ``head_size 256, sliding_window 4096, logits_soft_cap 50.0``."""
        parts = [f"head_size {self.head_size}"]
        if self.sliding_window is not None:
            parts.append(f"sliding_window {self.sliding_window}")
        if self.logits_soft_cap is not None:
            parts.append(f"logits_soft_cap {self.logits_soft_cap}")
        if self.has_sink:
            parts.append("attention sinks")
        return ", ".join(parts)


def head_size_of(config) -> int:
    """Per-head size: ``config.head_dim`` when set, else hidden_size / num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def sliding_window_of(config) -> int | None:
    """The attention window in tokens, or None when every layer attends to the whole context."""
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return getattr(config, "sliding_window", None)


def layer_types_windows(config) -> tuple[int | None, ...]:
    """Each layer's window by transformers' Qwen2 / Qwen3 rule: :func:`sliding_window_of` on the layers
    ``config.layer_types`` calls ``sliding_attention``, None on the others. Without ``layer_types`` (a config
    not built by transformers >= 4.53), the types transformers derives: layers from ``max_window_layers`` on
    slide; without that field either, every layer has the one window. (transformers nulls ``sliding_window``
    when ``use_sliding_window`` is false, so then no layer has a window, whatever ``layer_types`` says.)"""
    window = sliding_window_of(config)
    types = getattr(config, "layer_types", None)
    if types is None:
        first = getattr(config, "max_window_layers", None)
        if first is None:
            return (window,) * config.num_hidden_layers
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(config.num_hidden_layers)]
    return tuple(window if kind == "sliding_attention" else None for kind in types)


def per_layer_window_dims(config) -> ModelDims:
    """:func:`standard_dims` with each layer's window from :func:`layer_types_windows` (windowed and full
    layers form two layer groups); one window for every layer when the layers agree."""
    base = standard_dims(config)
    windows = layer_types_windows(config)
    if len(set(windows)) <= 1:
        return dataclasses.replace(base, sliding_window=windows[0] if windows else None)
    layers = tuple(LayerAttention(base.head_size, w) for w in windows)
    return dataclasses.replace(base, sliding_window=None, layers=layers)


def standard_dims(config) -> ModelDims:
    """Dims from the Llama-style field names (``num_key_value_heads`` falls back to the query heads)."""
    return ModelDims(
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_size=head_size_of(config),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        sliding_window=sliding_window_of(config),
    )


def mha_dims(config, intermediate_size: int) -> ModelDims:
    """Dims of a multi-head-attention model without GQA (GPT-2, OPT): one KV head per query head, head size
    hidden_size / num_attention_heads; the MLP width comes from the model's own config field."""
    return ModelDims(
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_attention_heads,
        head_size=config.hidden_size // config.num_attention_heads,
        hidden_size=config.hidden_size,
        intermediate_size=intermediate_size,
        vocab_size=config.vocab_size,
    )
