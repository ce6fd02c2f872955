"""What ``attnserve backends`` needs to know about a model: its attention shape, read from the config only.

No weights are loaded. A model folder is read with ``transformers.AutoConfig.from_pretrained`` (local
files only). With no model, the default model's facts are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelAttentionFacts:
    """The attention facts of a model that backend selection depends on."""

    source: str  # folder, or a description of where the facts came from
    head_size: int
    num_heads: int | None  # None when only --head-size was given
    num_kv_heads: int | None
    sliding_window: int | None = None  # tokens
    logits_soft_cap: float | None = None
    layers: tuple = ()
    """Each layer's ``LayerAttention`` (head size, window, soft cap, sinks) when the model's config was read;
    empty when the facts came from flags only."""
    hf_config: Any = field(default=None, repr=False, compare=False)
    """The model's transformers config (its checkpoint dtype decides ``--dtype auto`` on a GPU, through
    the engine's ``resolve_dtype``); None when the facts came from flags only."""


def read_model_facts(model: str | None) -> ModelAttentionFacts:
    """Facts of ``model`` (a folder, a .gguf file, or None for the default model), from its config only.

    Uses the engine's own resolver and the model class's ``dims`` so that ``backends`` judges exactly
    what the engine would run. Raises ValueError for a path that is no model or an unsupported architecture.
    """
    from attnserve.model_executor.loader import load_hf_config, resolve_model_source
    from attnserve.models.registry import get_model_class

    try:
        source = resolve_model_source(model, weights=False)  # a hub id: config and tokenizer only
    except FileNotFoundError as e:
        from attnserve.refusals.cli import model_unreadable

        raise ValueError(model_unreadable(e)) from None
    config = load_hf_config(source)
    dims = get_model_class(config).dims(config)
    layers = dims.layer_attention()
    return ModelAttentionFacts(
        source.path,
        dims.head_size,
        dims.num_heads,
        dims.num_kv_heads,
        layers[0].sliding_window,
        layers[0].logits_soft_cap,
        layers,
        hf_config=config,
    )
